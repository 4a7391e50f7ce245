"""OpenTelemetry traces of the platform's requests (`tracing` in the config): span names and
attributes (spans), the tracer setup and ASGI middleware, the Phoenix backend and its reader."""

"""The tracer of one process (the model router's, a replica's): OpenTelemetry's SDK with an OTLP
exporter and parent-based ratio sampling, set as the process's global provider so vLLM's engine
span (which vLLM writes through the global provider) is sampled and exported with ours. With
tracing off nothing here runs and OpenTelemetry is not imported."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from serving.config.tracing import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Tracer

_tracer: Tracer | None = None  # this process's, once set up


def tracer() -> Tracer | None:
    """The process's tracer; None while tracing is off (callers then do nothing)."""
    return _tracer


def urandom_id(bits: int) -> int:
    """A non-zero random id from the OS, not from Python's `random` (see os_random_ids)."""
    while True:
        value = int.from_bytes(os.urandom(bits // 8), "big")
        if value:
            return value


def os_random_ids() -> IdGenerator:
    """Trace and span ids from the OS. OpenTelemetry's default draws them from Python's global
    `random`, which vLLM seeds (engine.seed, 0): every replica then made the same ids, and the
    backend kept one span of each id and dropped the rest."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class OsRandomIds(IdGenerator):
        def generate_span_id(self) -> int:
            return urandom_id(64)

        def generate_trace_id(self) -> int:
            return urandom_id(128)

    return OsRandomIds()


def resource_attributes(config: TracingConfig, component: str) -> dict[str, str]:
    return {
        "service.name": config.service_name,
        "openinference.project.name": config.project,  # Phoenix's project of the spans
        "llm_serving.component": component,
    }


def span_exporter(config: TracingConfig) -> SpanExporter:
    assert config.otlp_endpoint is not None
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as OTLPHttpExporter,
    )

    return OTLPHttpExporter(endpoint=config.otlp_endpoint)


def start_tracing(config: TracingConfig, component: str) -> Tracer | None:
    """Set up this process's tracer when the config turns tracing on (once; later calls return
    the first). Spans are exported in batches off the request path (BatchSpanProcessor)."""
    global _tracer
    if _tracer is not None or not config.enabled:
        return _tracer
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create(resource_attributes(config, component)),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        id_generator=os_random_ids(),
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter(config)))
    trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("llm_serving")
    return _tracer


def tracing_env(config: TracingConfig) -> dict[str, str]:
    """What vLLM's own exporters read (its engine core process starts one from the environment):
    the same transport as ours."""
    return {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": config.protocol} if config.enabled else {}


def context_of(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The OpenTelemetry context a W3C `traceparent` names (None: a new trace starts)."""
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def traceparent_of(span: Any) -> dict[str, str]:
    """The W3C headers (`traceparent`, `tracestate`) that make a callee's span this span's child."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
    return carrier


def annotate(key: str, value: str | int | float) -> None:
    """Set an attribute on the current span, when tracing is on (a no-op otherwise)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attribute(key, value)

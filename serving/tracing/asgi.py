"""The span of each HTTP request at the router or a replica (plain ASGI, so streams pass through
untouched): it continues the caller's trace (`traceparent`, a client's or the router's), and the
request goes on carrying this span's context, so the next process's span (a replica's, vLLM's
engine span) is its child. A replica also shows the time the request waited in Serve between the
router's hand-off and its start (`replica.serve_queue`)."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import route_path
from serving.tracing import spans
from serving.tracing.setup import context_of, traceparent_of

TRACE_HEADERS = (b"traceparent", b"tracestate")
# Probes and scrapes, polled every second or so: a span each would bury the requests (as
# OpenTelemetry's own HTTP instrumentations leave out such paths by configuration).
UNTRACED_PATHS = frozenset({"/health", "/metrics", "/ping", "/version"})


def trace_headers(scope: Scope) -> dict[str, str]:
    """The request's W3C trace headers by name (the first of each)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        key = name.lower()
        if key in TRACE_HEADERS or key == spans.FORWARDED_AT_HEADER:
            found.setdefault(key.decode(), value.decode("latin-1"))
    return found


def with_trace_headers(scope: Scope, carrier: dict[str, str]) -> Scope:
    """The scope with its trace headers replaced by `carrier`'s (the current span's)."""
    kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in TRACE_HEADERS]
    added = [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]
    return {**scope, "headers": kept + added}


def forwarded_at_ns(headers: dict[str, str]) -> int | None:
    value = headers.get(spans.FORWARDED_AT_HEADER.decode())
    return int(value) if value and value.isdigit() else None


class TracedRequests:
    """One SERVER span per HTTP request (`name`: router.request or replica.request), with the
    route, status, model and replica (`attributes`); lifespan and other scopes pass through."""

    def __init__(self, app: ASGIApp, tracer: Any, name: str, attributes: dict[str, str]) -> None:
        self.app = app
        self.tracer = tracer
        self.name = name
        self.attributes = attributes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind

        headers = trace_headers(scope)
        parent = context_of(headers.get("traceparent"), headers.get("tracestate"))
        attributes = {
            **self.attributes,
            spans.HTTP_METHOD: scope.get("method", ""),
            spans.URL_PATH: scope.get("path", ""),
        }
        if request_id := header(scope, b"x-request-id"):
            attributes[spans.REQUEST_ID] = request_id
        with self.tracer.start_as_current_span(
            self.name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            sent_ns = forwarded_at_ns(headers)
            if sent_ns is not None and span.is_recording():
                queued = self.tracer.start_span(spans.SERVE_QUEUE, start_time=sent_ns)
                queued.end()

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute(spans.HTTP_STATUS, message["status"])
                await send(message)

            scope = with_trace_headers(scope, traceparent_of(span))
            await self.app(scope, receive, traced_send)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def forwarded_at_header() -> tuple[bytes, bytes]:
    """The router's hand-off moment, for the replica's serve_queue span."""
    return spans.FORWARDED_AT_HEADER, str(time.time_ns()).encode()

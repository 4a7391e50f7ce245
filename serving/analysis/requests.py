"""GET /requests on the analysis app: the last requests' timelines (queue, prefill, decode, the
replica and the routing decision), read back from the trace backend the platform exports its
spans to (Phoenix's REST API, `tracing.query_url`). The console's requests view draws them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Query

from serving.api.errors import APIError
from serving.config.tracing import TracingConfig
from serving.tracing import spans as s
from serving.tracing.phoenix import TraceBackendError, read_spans
from serving.tracing.timeline import request_timelines, trace_id

MAX_REQUESTS = 200  # one view: a bar per request stays readable, the read stays small
DEFAULT_REQUESTS = 50
DEFAULT_WINDOW_S = 3600
MAX_WINDOW_S = 7 * 86400
TRACES_PER_READ = 50  # trace ids per query: keeps the query string short
SpanReader = Callable[..., list[dict[str, Any]]]  # read_spans' signature

TRACING_OFF = (
    "tracing is off: this platform has no trace backend to read the requests' spans from. "
    "Start it with `llm-serving up --tracing` (runs Phoenix and sets tracing.otlp_endpoint and "
    "tracing.query_url), or set tracing.otlp_endpoint and tracing.query_url in the config to "
    "your Phoenix."
)


def tracing_off_error() -> APIError:
    """Not a failure of the server: the view is off, as the adapter routes are when off (404)."""
    return APIError(TRACING_OFF, status=404, code="tracing_off", kind="NotFoundError")


def backend_error(query_url: str, err: TraceBackendError) -> APIError:
    return APIError(
        f"the trace backend at {query_url} cannot be read ({err}); is Phoenix running there?",
        status=503,
        code="trace_backend_unavailable",
    )


def window_start(window_s: int, now: datetime | None = None) -> str:
    return ((now or datetime.now(UTC)) - timedelta(seconds=window_s)).isoformat()


def chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def read_request_spans(
    read: SpanReader, tracing: TracingConfig, limit: int, start_time: str
) -> list[dict[str, Any]]:
    """The newest `limit` engine spans, then the replica and routing spans of their traces."""
    url, project = tracing.query_url, tracing.project
    engines = read(url, project, names=[s.ENGINE_REQUEST], start_time=start_time, limit=limit)
    traces = sorted({trace_id(span) for span in engines} - {""})
    context: list[dict[str, Any]] = []
    for part in chunks(traces, TRACES_PER_READ):
        context += read(
            url,
            project,
            trace_ids=part,
            names=[s.REPLICA_REQUEST, s.ROUTING_DECISION],
            start_time=start_time,
            limit=20 * len(part),  # a few per trace; a retried request has one more of each
        )
    return engines + context


def requests_router(tracing: TracingConfig, read: SpanReader = read_spans) -> APIRouter:
    """The route over `tracing`'s backend; `read` is injected so the route is tested without one."""
    router = APIRouter()

    @router.get("/requests")
    def get_requests(
        limit: int = Query(DEFAULT_REQUESTS, ge=1, le=MAX_REQUESTS),
        window_s: int = Query(DEFAULT_WINDOW_S, ge=1, le=MAX_WINDOW_S),
    ) -> dict[str, Any]:
        if tracing.query_url is None:
            raise tracing_off_error()
        try:
            spans = read_request_spans(read, tracing, limit, window_start(window_s))
        except TraceBackendError as err:
            raise backend_error(tracing.query_url, err) from None
        timelines = request_timelines(spans, last=limit)
        return {
            "project": tracing.project,
            "limit": limit,
            "window_s": window_s,
            "replicas": sorted({t.replica for t in timelines}),
            "requests": [t.as_json() for t in timelines],
        }

    return router

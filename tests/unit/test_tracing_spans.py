"""The request span middleware and the routing decision span, against OpenTelemetry's in-memory
exporter (the integration test reads them back from a real Phoenix)."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from serving.api.dispatch import run_asgi
from serving.config.tracing import TracingConfig
from serving.routing import RoutingHint
from serving.tracing import decisions, setup, spans
from serving.tracing.asgi import TracedRequests, forwarded_at_header


@pytest.fixture
def exported() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(1.0)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def client_traceparent(sampled: bool = True) -> tuple[str, str, str]:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, span_id, f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def call(app: Any, headers: list[tuple[bytes, bytes]]) -> list[Any]:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}

    async def collect() -> list[Any]:
        return [m async for batch in run_asgi(app, scope, b"{}") for m in batch]

    return asyncio.run(collect())


def inner_app(seen: list[dict[str, str]], status: int = 200) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def test_a_request_continues_the_clients_trace_and_hands_its_own_span_on(exported: Any) -> None:
    tracer, exporter = exported
    trace_id, span_id, header = client_traceparent()
    seen: list[dict[str, str]] = []
    app = TracedRequests(inner_app(seen, 201), tracer, spans.REPLICA_REQUEST, {spans.REPLICA: "r1"})
    call(app, [(b"traceparent", header.encode()), (b"x-request-id", b"abc")])
    (span,) = exporter.get_finished_spans()
    assert span.name == spans.REPLICA_REQUEST
    assert format(span.context.trace_id, "032x") == trace_id
    assert format(span.parent.span_id, "016x") == span_id
    assert span.attributes[spans.HTTP_STATUS] == 201
    assert span.attributes[spans.REPLICA] == "r1"
    assert span.attributes[spans.REQUEST_ID] == "abc"
    assert span.attributes[spans.URL_PATH] == "/v1/chat/completions"
    # The app below sees this span as the parent (vLLM's engine span becomes its child).
    assert seen[0]["traceparent"] == f"00-{trace_id}-{format(span.context.span_id, '016x')}-01"


def test_the_wait_since_the_routers_hand_off_is_a_child_span(exported: Any) -> None:
    tracer, exporter = exported
    _, _, header = client_traceparent()
    name, value = forwarded_at_header()
    time.sleep(0.01)
    app = TracedRequests(inner_app([]), tracer, spans.REPLICA_REQUEST, {})
    call(app, [(b"traceparent", header.encode()), (name, value)])
    queued, request = sorted(
        exporter.get_finished_spans(), key=lambda s: s.name != spans.SERVE_QUEUE
    )
    assert queued.name == spans.SERVE_QUEUE
    assert queued.parent.span_id == request.context.span_id
    assert queued.start_time == int(value) and queued.end_time - queued.start_time >= 10_000_000


def test_an_unsampled_client_trace_records_nothing_and_stays_unsampled(exported: Any) -> None:
    tracer, exporter = exported
    trace_id, _, header = client_traceparent(sampled=False)
    seen: list[dict[str, str]] = []
    call(
        TracedRequests(inner_app(seen), tracer, spans.ROUTER_REQUEST, {}),
        [(b"traceparent", header.encode())],
    )
    assert exporter.get_finished_spans() == ()
    assert (
        seen[0]["traceparent"].startswith(f"00-{trace_id}-") and seen[0]["traceparent"][-2:] == "00"
    )


def test_probes_and_scrapes_are_not_traced(exported: Any) -> None:
    tracer, exporter = exported
    app = TracedRequests(inner_app([]), tracer, spans.REPLICA_REQUEST, {})
    for path in ("/health", "/metrics"):
        scope = {"type": "http", "method": "GET", "path": f"/m{path}", "root_path": "/m"}

        async def run(scope: Any = scope) -> None:
            [_ async for _ in run_asgi(app, {**scope, "headers": []}, b"")]

        asyncio.run(run())
    assert exporter.get_finished_spans() == ()
    call(app, [])  # the API routes are
    assert len(exporter.get_finished_spans()) == 1


def test_a_request_without_a_trace_starts_one(exported: Any) -> None:
    tracer, exporter = exported
    seen: list[dict[str, str]] = []
    call(TracedRequests(inner_app(seen), tracer, spans.ROUTER_REQUEST, {}), [])
    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert format(span.context.trace_id, "032x") in seen[0]["traceparent"]


def test_the_routing_decision_is_a_child_of_the_routers_span_with_why(
    exported: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer, exporter = exported
    monkeypatch.setattr(setup, "_tracer", tracer)
    trace_id, span_id, header = client_traceparent()
    pending = SimpleNamespace(
        created_at=time.time() - 0.5,
        metadata=SimpleNamespace(multiplexed_model_id="lora-a"),
        args=[{}, b"", RoutingHint("p", traceparent=header)],
    )
    decisions.note_decision(pending, "prefix match 3/4 chars", **{spans.ROUTING_PREFIX_MATCH: 3})
    replica = SimpleNamespace(unique_id="replica-7")
    decisions.record_decision("prefix_cache", pending, replica, 2, pending.args[2])
    (span,) = exporter.get_finished_spans()
    assert span.name == spans.ROUTING_DECISION
    assert format(span.parent.span_id, "016x") == span_id
    assert span.attributes[spans.ROUTING_POLICY] == "prefix_cache"
    assert span.attributes[spans.REPLICA] == "replica-7"
    assert span.attributes[spans.ROUTING_REASON] == "prefix match 3/4 chars"
    assert span.attributes[spans.ROUTING_PREFIX_MATCH] == 3
    assert span.attributes[spans.ROUTING_ADAPTER] == "lora-a"
    assert span.attributes[spans.ROUTING_QUEUED_S] >= 0.5
    assert span.end_time - span.start_time >= 500_000_000


def test_without_tracing_nothing_is_noted_or_written(exported: Any) -> None:
    _, exporter = exported
    pending = SimpleNamespace(created_at=time.time(), args=[RoutingHint(traceparent="00-x")])
    decisions.note_decision(pending, "why")
    decisions.record_decision("random", pending, SimpleNamespace(unique_id="r"), 1, pending.args[0])
    assert not hasattr(pending, decisions.NOTE) and exporter.get_finished_spans() == ()
    assert setup.start_tracing(TracingConfig(), "replica") is None  # no endpoint: off


def test_sampling_is_parent_based_on_the_configured_ratio() -> None:
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:4318/v1/traces", sample_ratio=0.25)
    assert config.enabled and not TracingConfig(sample_ratio=1.0).enabled
    assert (
        setup.resource_attributes(config, "router")["openinference.project.name"] == "llm-serving"
    )
    assert setup.tracing_env(config) == {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    with pytest.raises(ValueError, match="http"):
        TracingConfig(otlp_endpoint="tempo:4317")


def test_ids_do_not_repeat_when_vllm_seeds_pythons_random() -> None:
    import random

    ids = setup.os_random_ids()
    random.seed(0)  # as vLLM does in every replica (engine.seed)
    first = (ids.generate_trace_id(), ids.generate_span_id())
    random.seed(0)
    assert (ids.generate_trace_id(), ids.generate_span_id()) != first
    assert first[0] < 2**128 and 0 < first[1] < 2**64

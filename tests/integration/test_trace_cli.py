"""`llm-serving trace ID` end to end against a real Phoenix: spans shaped as serving/tracing/spans.py
says (router.request > router.routing_decision, replica.request > replica.serve_queue,
llm_request), sent through the OpenTelemetry SDK's OTLP/HTTP exporter with known times, found by
vLLM's request id, the client's X-Request-Id or the trace id, and printed as a timeline. No Ray
platform: Phoenix on free ports, so this runs beside one."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

from serving.tracing import spans as s
from serving.tracing.backend import Phoenix
from serving.tracing.phoenix import read_spans
from tests.integration.conftest import run_cli
from tests.integration.phoenix import free_port, is_loopback, listening_addresses

PROJECT = "trace-cli-test"
ENGINE_ID = "chatcmpl-forensics-1"
CLIENT_ID = "20261207"  # looks like a number: Phoenix must match it as a string
MS = 1_000_000  # ns
# name, parent, start ms, end ms, attributes: one request through the router, times known.
SPANS: list[tuple[str, str | None, int, int, dict]] = [
    (
        s.ROUTER_REQUEST,
        None,
        0,
        500,
        {s.MODEL: "tiny-qwen2", s.REQUEST_ID: CLIENT_ID, s.HTTP_STATUS: 200},
    ),
    (
        s.ROUTING_DECISION,
        s.ROUTER_REQUEST,
        1,
        3,
        {
            s.ROUTING_POLICY: "prefix_affinity",
            s.REPLICA: "replica-a",
            s.ROUTING_REASON: "prefix match 64 chars",
            s.ROUTING_QUEUED_S: 0.0005,
        },
    ),
    (s.REPLICA_REQUEST, s.ROUTER_REQUEST, 5, 495, {s.REPLICA: "replica-a", s.HTTP_STATUS: 200}),
    (s.SERVE_QUEUE, s.REPLICA_REQUEST, 5, 8, {}),
    (
        s.ENGINE_REQUEST,
        s.REPLICA_REQUEST,
        10,
        490,
        {
            s.ENGINE_REQUEST_ID: ENGINE_ID,
            s.ENGINE_QUEUE_S: 0.02,
            s.ENGINE_PREFILL_S: 0.1,
            s.ENGINE_DECODE_S: 0.36,
            s.ENGINE_TTFT_S: 0.12,
            s.ENGINE_PROMPT_TOKENS: 12,
            s.ENGINE_COMPLETION_TOKENS: 32,
        },
    ),
]


def send_trace(endpoint: str) -> str:
    """Export SPANS as one trace through the SDK; its trace id (32 hex)."""
    resource = Resource.create(
        {"service.name": "llm-serving", "openinference.project.name": PROJECT}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("test_trace_cli")
    t0 = time.time_ns()
    made = {}
    for name, parent, start_ms, _, attributes in SPANS:
        context = set_span_in_context(made[parent]) if parent else None
        kind = (
            SpanKind.SERVER if name in (s.ROUTER_REQUEST, s.REPLICA_REQUEST) else SpanKind.INTERNAL
        )
        made[name] = tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, start_time=t0 + start_ms * MS
        )
    for name, _, _, end_ms, _ in reversed(SPANS):
        made[name].end(end_time=t0 + end_ms * MS)
    provider.shutdown()  # flushes
    return format(made[s.ROUTER_REQUEST].get_span_context().trace_id, "032x")


def wait_for_spans(url: str, trace_id: str, count: int, timeout_s: float = 30.0) -> None:
    """Phoenix inserts what it receives in the background: until the trace's spans are readable."""
    deadline = time.monotonic() + timeout_s
    while len(read_spans(url, PROJECT, trace_ids=[trace_id])) < count:
        assert time.monotonic() < deadline, f"Phoenix holds no {count} spans of {trace_id}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def trace_id(phoenix: Phoenix) -> str:
    sent = send_trace(phoenix.otlp_http_endpoint)
    wait_for_spans(phoenix.url, sent, len(SPANS))
    return sent


def trace_cli(phoenix: Phoenix, ident: str, url: str | None = None):
    return run_cli("trace", ident, "--url", url or phoenix.url, "--project", PROJECT, timeout=120)


def span_lines(stdout: str) -> dict[str, str]:
    """Each span's line by its name (the names are unique in SPANS)."""
    names = [name for name, *_ in SPANS]
    found = {}
    for line in stdout.splitlines():
        for name in names:
            if f" {name}" in line and name not in found:
                found[name] = line
    return found


def test_a_request_is_found_by_vllms_id_and_printed_as_a_timeline(
    phoenix: Phoenix, trace_id: str
) -> None:
    done = trace_cli(phoenix, ENGINE_ID)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"trace {trace_id}  5 spans  500.0 ms")
    order = [name for name, *_ in SPANS]
    body = [line for line in lines if any(f" {name}" in line for name in order)]
    assert [next(n for n in order if f" {n}" in line) for line in body] == order  # tree order
    by_name = span_lines(done.stdout)
    engine = by_name[s.ENGINE_REQUEST]
    assert engine.split()[:2] == ["10.0", "480.0"]  # offset from the trace's start, duration
    assert "└─ llm_request" in engine
    for shown in ("queue=20.0ms", "prefill=100.0ms", "decode=360.0ms", "tokens=12→32", ENGINE_ID):
        assert shown in engine
    decision = by_name[s.ROUTING_DECISION]
    assert decision.split()[:2] == ["1.0", "2.0"]
    for shown in ("policy=prefix_affinity", "replica=replica-a", 'reason="prefix match 64 chars"'):
        assert shown in decision
    assert "router_wait=0.5ms" in decision
    assert by_name[s.ROUTER_REQUEST].split()[:2] == ["0.0", "500.0"]


def test_the_clients_request_id_and_the_trace_id_find_the_same_trace(
    phoenix: Phoenix, trace_id: str
) -> None:
    for ident in (CLIENT_ID, trace_id, trace_id.upper()):
        done = trace_cli(phoenix, ident)
        assert done.returncode == 0, (ident, done.stderr)
        assert done.stdout.startswith(f"trace {trace_id}  5 spans"), ident


def test_an_unknown_id_is_one_error_line(phoenix: Phoenix, trace_id: str) -> None:
    done = trace_cli(phoenix, "chatcmpl-never-sent")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: no trace in project 'trace-cli-test'")
    assert "chatcmpl-never-sent" in done.stderr


def test_a_backend_that_is_down_is_one_error_line(phoenix: Phoenix) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    done = trace_cli(phoenix, ENGINE_ID, url=down)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: cannot read spans from {down}")


def test_phoenix_listens_on_loopback_only(phoenix: Phoenix) -> None:
    addresses = listening_addresses(phoenix.pid)
    ports = {int(address.rpartition(":")[2]) for address in addresses}
    assert {phoenix.port, phoenix.grpc_port} <= ports, addresses
    assert all(is_loopback(address) for address in addresses), addresses

"""Traces end to end, in a real backend: a model router and a model's two vLLM replicas deployed
into the session platform with tracing on, exporting to a real Phoenix (tests/integration/
phoenix.py), read back through Phoenix's span API. A client's `traceparent` continues into the
platform: each request is one trace holding the router's span, its routing decision, the
replica's span and vLLM's engine span, nested in time within what the client measured. The
transformers baseline, traced too, continues the client's trace with its replica's span."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from serving.config import parse_config
from serving.deployments.analysis import build_analysis_app
from serving.deployments.hf_baseline import build_hf_app
from serving.deployments.model_router import build_router_app
from serving.deployments.vllm_server import build_vllm_app
from serving.tracing import spans
from serving.tracing.backend import Phoenix
from serving.tracing.phoenix import read_spans
from tests.integration.chromium import chromium
from tests.integration.conftest import MODEL, Platform, extra_apps

ROUTER, ROUTER_PREFIX = "traced-router", "/traced"
ANALYSIS_PREFIX = "/traced-analysis"
HF_PREFIX = "/traced-hf"
TRACED_MODEL = "traced"
PROJECT = "llm-serving-tests"
ENGINE = {"kv_cache_memory_gb": 0.25, "max_num_seqs": 8, "engine_core": "inprocess"}
EXPORT_WAIT_S = 30.0  # spans leave each process in batches every 5 s (OpenTelemetry's default)
# Clock resolution between processes of one machine: time.time() and OpenTelemetry's time_ns().
CLOCK_S = 0.002
# The spans of one request through the router (serving/tracing/spans.py).
ONE_TRACE = frozenset(
    {
        spans.ROUTER_REQUEST,
        spans.ROUTING_DECISION,
        spans.REPLICA_REQUEST,
        spans.SERVE_QUEUE,
        spans.ENGINE_REQUEST,
    }
)


@dataclass(frozen=True)
class Traced:
    phoenix: Phoenix
    base_url: str  # the router's OpenAI base URL
    analysis_url: str
    hf_url: str  # the traced transformers baseline's OpenAI base URL

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)

    def spans_of(self, trace_id: str, until: frozenset[str] = ONE_TRACE) -> list[dict[str, Any]]:
        """The trace's spans once spans of every name in `until` have arrived (each process
        exports on its own; bounded wait)."""
        deadline = time.monotonic() + EXPORT_WAIT_S
        while True:
            found = read_spans(self.phoenix.url, PROJECT, trace_ids=[trace_id])
            if until <= {s["name"] for s in found} or time.monotonic() > deadline:
                return found
            time.sleep(1.0)


def traced_apps(phoenix: Phoenix) -> tuple[list[tuple[str, str | None, Any]], Any]:
    tracing = {
        "otlp_endpoint": phoenix.otlp_http_endpoint,
        "query_url": phoenix.url,
        "project": PROJECT,
    }
    model = {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"}
    entry = {"name": TRACED_MODEL, "model": model, "engine": ENGINE, "num_replicas": 2}
    config = parse_config(
        {"vllm": {"route_prefix": ROUTER_PREFIX}, "models": [entry], "tracing": tracing}
    )
    models = [
        (e.app_name, None, build_vllm_app(config.model_platform(e), behind_router=True))
        for e in config.models
    ]
    analysis = parse_config(
        {"model": model, "analysis": {"route_prefix": ANALYSIS_PREFIX}, "tracing": tracing}
    )
    hf = parse_config({"model": model, "hf": {"route_prefix": HF_PREFIX}, "tracing": tracing})
    return [
        *models,
        (ROUTER, ROUTER_PREFIX, build_router_app(config)),
        ("traced-hf", HF_PREFIX, build_hf_app(hf)),
    ], analysis


@pytest.fixture(scope="module")
def traced(platform: Platform, phoenix: Phoenix) -> Iterator[Traced]:
    apps, analysis = traced_apps(phoenix)
    analysis_app = ("traced-analysis", ANALYSIS_PREFIX, build_analysis_app(analysis))
    with extra_apps([*apps, analysis_app]):
        yield Traced(
            phoenix,
            f"{platform.url}{ROUTER_PREFIX}/v1",
            f"{platform.url}{ANALYSIS_PREFIX}",
            f"{platform.url}{HF_PREFIX}/v1",
        )


def traceparent() -> tuple[str, str, str]:
    """A client's own sampled span: (trace id, span id, its traceparent header)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


@dataclass(frozen=True)
class Sent:
    trace_id: str
    span_id: str
    response_id: str
    sent_s: float  # time.time() when the client sent it
    first_token_s: float | None  # when its first token arrived (streaming)
    done_s: float  # when the last byte arrived


def send(traced: Traced, stream: bool, content: str) -> Sent:
    trace_id, span_id, header = traceparent()
    client = traced.client()
    messages: Any = [{"role": "user", "content": content}]
    sent = time.time()
    if not stream:
        done = client.chat.completions.create(
            model=TRACED_MODEL,
            messages=messages,
            max_tokens=12,
            extra_headers={"traceparent": header},
        )
        return Sent(trace_id, span_id, done.id, sent, None, time.time())
    first, response_id = None, ""
    chunks = client.chat.completions.create(
        model=TRACED_MODEL,
        messages=messages,
        max_tokens=12,
        stream=True,
        extra_headers={"traceparent": header},
    )
    for chunk in chunks:
        response_id = chunk.id
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.time()
    return Sent(trace_id, span_id, response_id, sent, first, time.time())


def seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def only(found: list[dict[str, Any]], name: str) -> dict[str, Any]:
    named = [s for s in found if s["name"] == name]
    assert len(named) == 1, f"{len(named)} spans named {name}: {[s['name'] for s in found]}"
    return named[0]


def test_a_clients_trace_holds_the_router_its_decision_the_replica_and_the_engine(
    traced: Traced,
) -> None:
    sent = [send(traced, stream, f"Count to {n}.") for n, stream in enumerate([True, False] * 2)]
    replicas = set()
    for request in sent:
        found = traced.spans_of(request.trace_id)
        assert {s["context"]["trace_id"] for s in found} == {request.trace_id}
        router = only(found, spans.ROUTER_REQUEST)
        decision = only(found, spans.ROUTING_DECISION)
        replica = only(found, spans.REPLICA_REQUEST)
        engine = only(found, spans.ENGINE_REQUEST)
        queued = only(found, spans.SERVE_QUEUE)
        # The client's span is the root's parent; the rest descend from the router's span.
        assert router["parent_id"] == request.span_id
        router_id = router["context"]["span_id"]
        assert decision["parent_id"] == router_id and replica["parent_id"] == router_id
        assert engine["parent_id"] == replica["context"]["span_id"]
        assert queued["parent_id"] == replica["context"]["span_id"]
        # Which replica Serve chose, and why, is the replica that served it.
        chosen = decision["attributes"][spans.REPLICA]
        assert chosen == replica["attributes"][spans.REPLICA]
        assert decision["attributes"][spans.ROUTING_POLICY] == "power_of_two"
        assert "among 2" in decision["attributes"][spans.ROUTING_REASON]
        replicas.add(chosen)
        assert router["attributes"][spans.MODEL] == TRACED_MODEL
        assert router["attributes"][spans.HTTP_STATUS] == 200
        assert engine["attributes"][spans.ENGINE_REQUEST_ID] == request.response_id
        assert engine["attributes"][spans.ENGINE_COMPLETION_TOKENS] > 0
        # Nested in time within what the client measured, each inside its parent.
        start = {s["name"]: seconds(s["start_time"]) for s in found}
        end = {s["name"]: seconds(s["end_time"]) for s in found}
        assert request.sent_s - CLOCK_S <= start[spans.ROUTER_REQUEST]
        assert start[spans.ROUTER_REQUEST] <= start[spans.REPLICA_REQUEST] + CLOCK_S
        assert start[spans.REPLICA_REQUEST] <= start[spans.ENGINE_REQUEST] + CLOCK_S
        assert end[spans.ENGINE_REQUEST] <= end[spans.REPLICA_REQUEST] + CLOCK_S
        assert end[spans.REPLICA_REQUEST] <= end[spans.ROUTER_REQUEST] + CLOCK_S
        # The last token left the engine before the client had it (the servers' spans end
        # later: they close the stream and the handle after the client's last event).
        assert end[spans.ENGINE_REQUEST] <= request.done_s + CLOCK_S
        client_e2e = request.done_s - request.sent_s
        assert engine["attributes"][spans.ENGINE_E2E_S] <= client_e2e + CLOCK_S
        if request.first_token_s is not None:
            client_ttft = request.first_token_s - request.sent_s
            assert engine["attributes"][spans.ENGINE_TTFT_S] <= client_ttft + CLOCK_S
        # vLLM's split of its own time adds up to its span.
        split = sum(
            engine["attributes"][key]
            for key in (spans.ENGINE_QUEUE_S, spans.ENGINE_PREFILL_S, spans.ENGINE_DECODE_S)
        )
        assert split <= end[spans.ENGINE_REQUEST] - start[spans.ENGINE_REQUEST] + CLOCK_S
    assert replicas  # one or both replicas: power of two picks the less loaded


def test_an_unsampled_client_trace_leaves_no_spans_and_no_header_starts_one(
    traced: Traced,
) -> None:
    trace_id, span_id, _ = traceparent()
    client = traced.client()
    messages: Any = [{"role": "user", "content": "Hi"}]
    client.chat.completions.create(
        model=TRACED_MODEL,
        messages=messages,
        max_tokens=2,
        extra_headers={"traceparent": f"00-{trace_id}-{span_id}-00"},
    )
    fresh = client.chat.completions.create(model=TRACED_MODEL, messages=messages, max_tokens=2)
    # The request without a traceparent is a trace of its own (sample_ratio 1.0)...
    deadline = time.monotonic() + EXPORT_WAIT_S
    engine: list[dict[str, Any]] = []
    while not engine and time.monotonic() < deadline:
        engine = read_spans(
            traced.phoenix.url, PROJECT, attributes={spans.ENGINE_REQUEST_ID: fresh.id}
        )
        time.sleep(1.0)
    assert len(engine) == 1
    root = only(traced.spans_of(engine[0]["context"]["trace_id"]), spans.ROUTER_REQUEST)
    assert root["parent_id"] is None
    # ...exported after the unsampled one was sent: that one left nothing.
    assert read_spans(traced.phoenix.url, PROJECT, trace_ids=[trace_id]) == []


def test_the_baselines_span_continues_the_clients_trace(traced: Traced) -> None:
    trace_id, span_id, header = traceparent()
    client = openai.OpenAI(base_url=traced.hf_url, api_key="unused", max_retries=0)
    sent = time.time()
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_headers={"traceparent": header},
    )
    done = time.time()
    replica = only(
        traced.spans_of(trace_id, frozenset({spans.REPLICA_REQUEST})), spans.REPLICA_REQUEST
    )
    assert replica["parent_id"] == span_id
    assert replica["attributes"][spans.HTTP_STATUS] == 200
    assert replica["attributes"][spans.MODEL] == MODEL
    assert replica["attributes"][spans.URL_PATH].endswith("/v1/chat/completions")
    assert sent - CLOCK_S <= seconds(replica["start_time"]) <= seconds(replica["end_time"])
    assert seconds(replica["end_time"]) <= done + CLOCK_S


# --- The console's requests view over the spans of a c8 run ---------------------------------------

C8 = 8
C8_TOKENS = 32  # every request still decodes when the last one arrives (c8: arrivals within ~10 ms)


def c8_run(traced: Traced) -> list[str]:
    """8 chats sent at once (released together by a barrier): their response ids."""
    start = threading.Barrier(C8)

    def chat(n: int) -> str:
        client = traced.client()
        start.wait(timeout=60)
        done = client.chat.completions.create(
            model=TRACED_MODEL,
            messages=[{"role": "user", "content": f"Tell a story about the number {n}."}],
            max_tokens=C8_TOKENS,
            extra_body={"ignore_eos": True},
        )
        return done.id

    with ThreadPoolExecutor(C8) as pool:
        return list(pool.map(chat, range(C8)))


def route_has(analysis: httpx.Client, ids: set[str]) -> dict[str, Any]:
    """GET /requests?limit=8 once it answers the c8 run's requests with their routing decisions
    (bounded wait: the router and each replica export their spans on their own)."""
    deadline = time.monotonic() + EXPORT_WAIT_S
    while True:
        body = analysis.get("/requests", params={"limit": C8}).json()
        found = {r["request_id"] for r in body["requests"] if r["routing_policy"]}
        if found == ids or time.monotonic() > deadline:
            return body
        time.sleep(1.0)


def test_the_consoles_requests_view_draws_a_c8_run_batched_on_its_replicas(
    traced: Traced,
) -> None:
    ids = set(c8_run(traced))
    with httpx.Client(base_url=traced.analysis_url, timeout=60) as analysis:
        body = route_has(analysis, ids)
    assert {r["request_id"] for r in body["requests"]} == ids
    replicas = {r["replica"] for r in body["requests"]}
    assert "unknown" not in replicas and set(body["replicas"]) == replicas
    with chromium() as page:
        page.goto(traced.analysis_url)
        page.wait_for("window.analysisConsole.requests !== null")
        page.type_into("#requests input[name=limit]", str(C8))
        page.click("#requests button")
        page.wait_for(f"window.analysisConsole.requests?.limit === {C8}")
        bars = page.wait_for(
            "(b => b.length && b.map(x => ({id: x.dataset.requestId, replica: x.dataset.replica,"
            " start: +x.dataset.start, end: +x.dataset.end, title: x.querySelector('title')"
            ".textContent, segments: [...x.querySelectorAll('rect.segment')]"
            ".map(r => [r.classList[1], +r.getAttribute('width')])})))"
            "([...document.querySelectorAll('#requests g.bar')])"
        )
        lanes = page.evaluate(
            "[...document.querySelectorAll('#requests g.lane')].map(l => [l.dataset.replica,"
            " l.querySelector('.lane-label').textContent, l.querySelectorAll('g.bar').length])"
        )
        if shots := os.environ.get("LLM_SERVING_SCREENSHOTS"):
            page.screenshot("#requests", Path(shots) / "requests.png")
    # One bar per request, each split into its three phases, with every token it decoded.
    assert len(bars) == C8 and {bar["id"] for bar in bars} == ids
    for bar in bars:
        assert [name for name, _ in bar["segments"]] == ["queue", "prefill", "decode"]
        assert dict(bar["segments"])["decode"] > 0
        assert "routed by power_of_two" in bar["title"]
        assert f"{C8_TOKENS} completion" in bar["title"]
    # Continuous batching: every request was still running when the last one arrived.
    assert max(bar["start"] for bar in bars) < min(bar["end"] for bar in bars)
    # A lane per replica that served them, named by its id, holding that replica's bars.
    assert {name for name, _, _ in lanes} == replicas
    assert all(label == name for name, label, _ in lanes)
    served = {name: sum(bar["replica"] == name for bar in bars) for name in replicas}
    assert {name: count for name, _, count in lanes} == served

"""Request timelines from span JSON shaped as Phoenix's REST API returns it (GET
/v1/projects/{project}/spans: context, parent_id, ISO 8601 times, flat attributes), and the
analysis app's GET /requests over an injected span reader. The panel drawing them in a browser is
tested against real spans in tests/integration/test_tracing.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.analysis.attention import load_analysis_model
from serving.analysis.requests import MAX_REQUESTS, TRACES_PER_READ, requests_router
from serving.api.errors import install_error_handlers
from serving.config import AnalysisDeploymentConfig
from serving.config.tracing import TracingConfig
from serving.deployments.analysis import build_analysis_api
from serving.models import resolve_model
from serving.tracing import spans as s
from serving.tracing.phoenix import TraceBackendError
from serving.tracing.timeline import UNKNOWN_REPLICA, epoch_seconds, request_timelines

T0 = datetime(2026, 12, 7, 9, 0, 0, tzinfo=UTC)
PHOENIX = TracingConfig(
    otlp_endpoint="http://127.0.0.1:6006/v1/traces", query_url="http://127.0.0.1:6006"
)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def span(
    name: str, trace: str, sid: str, parent: str | None, start: float, end: float, **attributes: Any
) -> dict[str, Any]:
    return {
        "id": f"U3BhbjpO{sid}",
        "name": name,
        "context": {"trace_id": trace, "span_id": sid},
        "span_kind": "UNKNOWN",
        "parent_id": parent,
        "start_time": at(start),
        "end_time": at(end),
        "status_code": "OK",
        "status_message": "",
        "attributes": attributes,
        "events": [],
    }


def engine(trace: str, sid: str, parent: str | None, start: float, **extra: Any) -> dict:
    attributes = {
        s.ENGINE_REQUEST_ID: f"chatcmpl-{sid}",
        s.ENGINE_QUEUE_S: 0.25,
        s.ENGINE_PREFILL_S: 0.5,
        s.ENGINE_DECODE_S: 1.0,
        s.ENGINE_PROMPT_TOKENS: 12,
        s.ENGINE_COMPLETION_TOKENS: 16,
        **extra,
    }
    return span(s.ENGINE_REQUEST, trace, sid, parent, start, start + 1.8, **attributes)


def routed_request(trace: str, start: float, replica: str) -> list[dict]:
    """A request through the router: router.request > decision, replica.request > llm_request."""
    return [
        span(s.ROUTER_REQUEST, trace, f"{trace}r", None, start, start + 2),
        span(
            s.ROUTING_DECISION,
            trace,
            f"{trace}d",
            f"{trace}r",
            start,
            start + 0.01,
            **{s.ROUTING_POLICY: "prefix_affinity", s.ROUTING_REASON: "prefix match 40 chars"},
        ),
        span(
            s.REPLICA_REQUEST,
            trace,
            f"{trace}q",
            f"{trace}r",
            start + 0.01,
            start + 1.95,
            **{s.REPLICA: replica, s.MODEL: "tiny-qwen2"},
        ),
        span(s.SERVE_QUEUE, trace, f"{trace}w", f"{trace}q", start + 0.01, start + 0.02),
        engine(trace, f"{trace}e", f"{trace}q", start + 0.02),
    ]


def test_a_routed_request_has_its_replica_phases_tokens_and_routing_reason() -> None:
    (timeline,) = request_timelines(routed_request("t1", 3.0, "rep-a"))
    assert timeline.as_json() == {
        "request_id": "chatcmpl-t1e",
        "trace_id": "t1",
        "replica": "rep-a",
        "model": "tiny-qwen2",
        "arrival": epoch_seconds(at(3.02)),
        "queue_s": 0.25,
        "prefill_s": 0.5,
        "decode_s": 1.0,
        "end": epoch_seconds(at(4.82)),
        "prompt_tokens": 12,
        "completion_tokens": 16,
        "routing_policy": "prefix_affinity",
        "routing_reason": "prefix match 40 chars",
    }


def test_the_replica_is_found_through_spans_between_it_and_the_engine_span() -> None:
    spans = routed_request("t1", 0, "rep-a")
    spans[-1]["parent_id"] = "t1w"  # the engine span under replica.serve_queue
    assert request_timelines(spans)[0].replica == "rep-a"


def test_the_replica_is_found_by_time_when_the_parent_chain_was_not_read() -> None:
    spans = [x for x in routed_request("t1", 0, "rep-a") if x["name"] != s.SERVE_QUEUE]
    spans[-1]["parent_id"] = "t1w"  # its parent is not among the spans read
    assert request_timelines(spans)[0].replica == "rep-a"


def test_without_its_replica_span_the_replica_is_the_one_the_router_chose() -> None:
    spans = [x for x in routed_request("t1", 0, "rep-a") if x["name"] != s.REPLICA_REQUEST]
    spans[1]["attributes"] |= {s.REPLICA: "rep-z", s.MODEL: "m"}  # the routing decision
    assert (request_timelines(spans)[0].replica, request_timelines(spans)[0].model) == (
        "rep-z",
        "m",
    )
    spans.append(routed_request("t1", 0, "rep-a")[2])  # the replica's own span wins
    assert request_timelines(spans)[0].replica == "rep-a"


def test_without_replica_or_router_spans_the_replica_is_unknown_and_no_routing() -> None:
    (timeline,) = request_timelines([engine("t9", "e9", None, 0, **{"gen_ai.response.model": "m"})])
    assert (timeline.replica, timeline.model) == (UNKNOWN_REPLICA, "m")
    assert (timeline.routing_policy, timeline.routing_reason) == (None, None)


def test_the_last_n_by_arrival_oldest_first() -> None:
    spans = [x for i, rep in enumerate("abcab") for x in routed_request(f"t{i}", 5 - i, rep)]
    timelines = request_timelines(spans, last=3)
    assert [t.trace_id for t in timelines] == ["t2", "t1", "t0"]
    assert [t.replica for t in timelines] == ["c", "b", "a"]
    assert request_timelines(spans, last=0) == []


def test_a_retried_request_takes_the_decision_made_before_its_engine_span() -> None:
    spans = routed_request("t1", 10, "rep-b")
    first = span(s.ROUTING_DECISION, "t1", "t1x", "t1r", 9, 9.01, **{s.ROUTING_REASON: "first"})
    later = span(s.ROUTING_DECISION, "t1", "t1y", "t1r", 30, 30.01, **{s.ROUTING_REASON: "later"})
    assert request_timelines([first, *spans, later])[0].routing_reason == "prefix match 40 chars"


def test_nested_attributes_and_missing_latencies_are_read() -> None:
    nested = engine("t1", "e1", None, 0)
    nested["attributes"] = {
        "gen_ai": {"request": {"id": "cmpl-1"}, "latency": {"time_in_queue": 2}}
    }
    (timeline,) = request_timelines([nested])
    assert (timeline.request_id, timeline.queue_s, timeline.decode_s) == ("cmpl-1", 2.0, 0.0)
    assert timeline.prompt_tokens is None


@pytest.mark.parametrize(
    ("iso", "expected"),
    [
        ("2026-12-07T09:00:00+00:00", 0.0),
        ("2026-12-07T09:00:00Z", 0.0),
        ("2026-12-07T09:00:01.5", 1.5),  # no zone: UTC
        ("2026-12-07T09:00:00.123456789+00:00", 0.123456),  # nanoseconds: microseconds kept
        ("2026-12-07T10:00:00+01:00", 0.0),
    ],
)
def test_iso_times(iso: str, expected: float) -> None:
    assert epoch_seconds(iso) - T0.timestamp() == pytest.approx(expected, abs=1e-6)


# --- GET /requests ------------------------------------------------------------------------------


class FakePhoenix:
    """Answers read_spans' queries from a list of spans, as Phoenix filters them."""

    def __init__(self, spans: list[dict], error: Exception | None = None) -> None:
        self.spans, self.error = spans, error
        self.queries: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, url: str, project: str, **query: Any) -> list[dict]:
        self.queries.append((url, project, query))
        if self.error:
            raise self.error
        traces, names = set(query.get("trace_ids", ())), set(query.get("names", ()))
        found = [
            x
            for x in self.spans
            if (not traces or x["context"]["trace_id"] in traces) and x["name"] in names
        ]
        return found[::-1][: query["limit"]]


def requests_api(tracing: TracingConfig, reader: FakePhoenix) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(requests_router(tracing, reader))
    return TestClient(app)


def test_the_route_reads_engine_spans_then_their_traces_and_answers_timelines() -> None:
    spans = [x for i, rep in enumerate("ab") for x in routed_request(f"t{i}", i, rep)]
    phoenix = FakePhoenix(spans)
    body = requests_api(PHOENIX, phoenix).get("/requests", params={"limit": 5}).json()
    assert [r["trace_id"] for r in body["requests"]] == ["t0", "t1"]
    assert body["replicas"] == ["a", "b"] and body["project"] == "llm-serving"
    (url, project, first), (_, _, second) = phoenix.queries
    assert (url, project, first["names"], first["limit"]) == (
        "http://127.0.0.1:6006",
        "llm-serving",
        [s.ENGINE_REQUEST],
        5,
    )
    assert second["trace_ids"] == ["t0", "t1"]
    assert set(second["names"]) == {s.REPLICA_REQUEST, s.ROUTING_DECISION}
    window = datetime.now(UTC) - datetime.fromisoformat(first["start_time"])
    assert timedelta(minutes=59) < window < timedelta(minutes=61)  # the default hour


def test_many_traces_are_read_in_parts() -> None:
    spans = [engine(f"t{i:03}", f"e{i}", None, i) for i in range(TRACES_PER_READ + 1)]
    phoenix = FakePhoenix(spans)
    body = requests_api(PHOENIX, phoenix).get("/requests", params={"limit": 100}).json()
    assert len(body["requests"]) == TRACES_PER_READ + 1
    assert [len(q["trace_ids"]) for _, _, q in phoenix.queries[1:]] == [TRACES_PER_READ, 1]


def test_no_spans_yet_is_an_empty_list() -> None:
    body = requests_api(PHOENIX, FakePhoenix([])).get("/requests").json()
    assert (body["requests"], body["replicas"], body["limit"]) == ([], [], 50)


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": MAX_REQUESTS + 1}, {"limit": "x"}, {"window_s": 0}]
)
def test_a_bad_query_is_a_400_in_the_openai_shape(params: dict) -> None:
    phoenix = FakePhoenix([])
    response = requests_api(PHOENIX, phoenix).get("/requests", params=params)
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == next(iter(params)) or next(iter(params)) in error["message"]
    assert phoenix.queries == []


def test_tracing_off_is_a_404_that_says_how_to_turn_it_on() -> None:
    phoenix = FakePhoenix([])
    response = requests_api(TracingConfig(), phoenix).get("/requests")
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "tracing_off"
    assert (
        "llm-serving up --tracing" in error["message"] and "tracing.query_url" in error["message"]
    )
    assert phoenix.queries == []


def test_a_backend_that_cannot_be_read_is_a_503_naming_it() -> None:
    down = TraceBackendError("cannot read spans from http://127.0.0.1:6006: connection refused")
    response = requests_api(PHOENIX, FakePhoenix([], down)).get("/requests")
    error = response.json()["error"]
    assert response.status_code == 503 and error["code"] == "trace_backend_unavailable"
    assert "http://127.0.0.1:6006" in error["message"] and "connection refused" in error["message"]


def test_the_analysis_app_answers_tracing_off_without_a_tracing_config() -> None:
    tiny = load_analysis_model(resolve_model("tiny-qwen2"), "float32")
    api = TestClient(build_analysis_api(*tiny, AnalysisDeploymentConfig(), "tiny-qwen2"))
    response = api.get("/requests")
    assert response.status_code == 404 and response.json()["error"]["code"] == "tracing_off"

"""`llm-serving trace`'s timeline from span JSON shaped as Phoenix's REST API returns it (context,
parent_id, ISO 8601 times, flat attributes), and how an id finds its trace, over a fake reader.
Against a real Phoenix: tests/integration/test_trace_cli.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from serving.tracing import spans as s
from serving.tracing.forensics import (
    DECODE_BAR,
    LEGEND,
    PREFILL_BAR,
    QUEUE_BAR,
    SPAN_BAR,
    TraceNotFound,
    bar,
    find_trace,
    format_timeline,
    is_trace_id,
    tree,
)

T0 = datetime(2026, 12, 7, 9, 0, 0, tzinfo=UTC)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def span(
    name: str, sid: str, parent: str | None, start_ms: float, end_ms: float, **attributes: Any
) -> dict[str, Any]:
    def at(ms: float) -> str:
        return (T0 + timedelta(milliseconds=ms)).isoformat()

    return {
        "name": name,
        "context": {"trace_id": TRACE, "span_id": sid},
        "parent_id": parent,
        "start_time": at(start_ms),
        "end_time": at(end_ms),
        "status_code": "OK",
        "attributes": attributes,
    }


ENGINE = span(
    s.ENGINE_REQUEST,
    "e",
    "r",
    100,
    500,
    **{
        s.ENGINE_REQUEST_ID: "chatcmpl-1",
        s.ENGINE_QUEUE_S: 0.1,
        s.ENGINE_PREFILL_S: 0.1,
        s.ENGINE_DECODE_S: 0.2,
        s.ENGINE_PROMPT_TOKENS: 7,
        s.ENGINE_COMPLETION_TOKENS: 16,
    },
)
TRACE_SPANS = [  # newest first, as Phoenix returns them
    ENGINE,
    span(s.SERVE_QUEUE, "q", "r", 50, 100),
    span(s.REPLICA_REQUEST, "r", "root", 50, 600, **{s.REPLICA: "rep-1"}),
    span(
        s.ROUTING_DECISION,
        "d",
        "root",
        10,
        40,
        **{s.ROUTING_POLICY: "least_load", s.ROUTING_REASON: "lowest load 0.5", s.REPLICA: "rep-1"},
    ),
    span(s.ROUTER_REQUEST, "root", "client-span", 0, 800, **{s.HTTP_STATUS: 200}),
]


def test_the_tree_orders_children_by_start_under_their_parent() -> None:
    ordered = [(found["name"], prefix) for found, prefix in tree(TRACE_SPANS)]
    assert ordered == [
        (s.ROUTER_REQUEST, ""),  # its parent (the client's span) is not in the trace: a root
        (s.ROUTING_DECISION, "├─ "),
        (s.REPLICA_REQUEST, "└─ "),
        (s.SERVE_QUEUE, "   ├─ "),
        (s.ENGINE_REQUEST, "   └─ "),
    ]


def test_each_line_has_offset_duration_and_key_attributes() -> None:
    lines = format_timeline(TRACE_SPANS, width=8)
    assert lines[0] == f"trace {TRACE}  5 spans  800.0 ms  started 2026-12-07 09:00:00.000 UTC"
    assert lines[-1].strip() == LEGEND
    rows = [line.split() for line in lines[2:-1]]
    assert [row[:2] for row in rows] == [
        ["0.0", "800.0"],
        ["10.0", "30.0"],
        ["50.0", "550.0"],
        ["50.0", "50.0"],
        ["100.0", "400.0"],
    ]
    decision, engine = lines[3], lines[6]
    assert "policy=least_load" in decision and 'reason="lowest load 0.5"' in decision
    assert "replica=rep-1" in decision
    for shown in ("id=chatcmpl-1", "queue=100.0ms", "prefill=100.0ms", "decode=200.0ms"):
        assert shown in engine
    assert "tokens=7→16" in engine


def test_the_engine_bar_shows_queue_then_prefill_then_decode() -> None:
    t0 = T0.timestamp()
    # 100 ms a cell: the engine span (100-500 ms) is cells 1-4: 1 queue, 1 prefill, 2 decode.
    assert bar(ENGINE, t0, 0.8, width=8) == f" {QUEUE_BAR}{PREFILL_BAR}{DECODE_BAR}{DECODE_BAR}   "
    router = TRACE_SPANS[-1]
    assert bar(router, t0, 0.8, width=8) == SPAN_BAR * 8


def test_a_span_shorter_than_a_cell_still_shows() -> None:
    tiny = span(s.SERVE_QUEUE, "q", None, 0, 0.001)
    assert bar(tiny, T0.timestamp(), 10.0, width=10) == SPAN_BAR + " " * 9


def test_an_error_span_says_so() -> None:
    failed = {**TRACE_SPANS[-1], "status_code": "ERROR", "status_message": "replica died"}
    assert 'error="replica died"' in format_timeline([failed])[2]


def test_no_spans_no_lines() -> None:
    assert format_timeline([]) == []


class FakeReader:
    """read_spans over a list of spans: answers attribute queries, records them."""

    def __init__(self, spans: list[dict[str, Any]]) -> None:
        self.spans, self.queries = spans, []

    def __call__(self, url: str, project: str, *, attributes: dict[str, str], limit: int):
        self.queries.append(attributes)
        return [
            found
            for found in self.spans
            if all(found["attributes"].get(k) == v for k, v in attributes.items())
        ][:limit]


def test_a_trace_id_is_used_as_it_is() -> None:
    reader = FakeReader([])
    assert find_trace(reader, "http://p", "proj", TRACE.upper()).trace_id == TRACE
    assert reader.queries == []
    assert is_trace_id(TRACE) and not is_trace_id("chatcmpl-1") and not is_trace_id(TRACE[:-1])


def test_vllms_request_id_then_the_clients_find_the_newest_trace() -> None:
    older = {**ENGINE, "context": {"trace_id": "0" * 32, "span_id": "x"}}
    client = span(s.ROUTER_REQUEST, "c", None, 0, 1, **{s.REQUEST_ID: "my-id"})
    reader = FakeReader([ENGINE, older, client])
    found = find_trace(reader, "http://p", "proj", "chatcmpl-1")
    assert (found.trace_id, found.others) == (TRACE, ["0" * 32])
    assert find_trace(reader, "http://p", "proj", "my-id").trace_id == TRACE
    assert reader.queries[-2:] == [{s.ENGINE_REQUEST_ID: "my-id"}, {s.REQUEST_ID: "my-id"}]


def test_an_unknown_id_says_where_it_looked() -> None:
    with pytest.raises(TraceNotFound, match="no trace in project 'proj' at http://p holds"):
        find_trace(FakeReader(TRACE_SPANS), "http://p", "proj", "chatcmpl-missing")

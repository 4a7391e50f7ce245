"""Request timelines from spans as Phoenix returns them (serving/tracing/phoenix.py): one per vLLM
engine span (`llm_request`), with where its time went (queue, prefill, decode), the replica that
served it (its `replica.request` ancestor) and why the router chose that replica. The console's
requests view draws these; pure functions over span JSON, so they are tested without a backend."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from serving.tracing import spans as s

Span = Mapping[str, Any]
UNKNOWN_REPLICA = "unknown"


@dataclass(frozen=True)
class RequestTimeline:
    """One request at the engine. Times are seconds since the epoch; the phases follow each other
    from `arrival`: queue (waiting for the scheduler), prefill (to the first token), decode."""

    request_id: str | None
    trace_id: str
    replica: str
    model: str | None
    arrival: float
    queue_s: float
    prefill_s: float
    decode_s: float
    end: float
    prompt_tokens: int | None
    completion_tokens: int | None
    routing_policy: str | None
    routing_reason: str | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def epoch_seconds(iso: str) -> float:
    """Seconds since the epoch of an ISO 8601 time; a time without a zone is UTC, as Phoenix's.
    Digits past microseconds are dropped (Python parses at most six)."""
    head, dot, rest = iso.replace("Z", "+00:00").partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        rest = rest[: min(digits, 6)] + rest[digits:]
    parsed = datetime.fromisoformat(head + dot + rest if dot else head)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def attribute(span: Span, key: str) -> Any:
    """An attribute by its dotted key, whether the JSON holds it flat or nested by dots."""
    attributes = span.get("attributes") or {}
    if key in attributes:
        return attributes[key]
    node: Any = attributes
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def span_id(span: Span) -> str | None:
    return (span.get("context") or {}).get("span_id")


def trace_id(span: Span) -> str:
    return (span.get("context") or {}).get("trace_id") or ""


def seconds(span: Span, key: str) -> float:
    value = attribute(span, key)
    return max(0.0, float(value)) if value is not None else 0.0


def whole(value: Any) -> int | None:
    return int(value) if value is not None else None


def replica_span(engine: Span, by_id: Mapping[str, Span], in_trace: list[Span]) -> Span | None:
    """The engine span's `replica.request` ancestor; when the parent chain leaves the spans read,
    the trace's replica span whose time holds the engine span's start."""
    parent = by_id.get(engine.get("parent_id") or "")
    for _ in range(len(by_id)):  # bounded: a malformed chain cannot loop
        if parent is None:
            break
        if parent.get("name") == s.REPLICA_REQUEST:
            return parent
        parent = by_id.get(parent.get("parent_id") or "")
    start = epoch_seconds(engine["start_time"])
    for span in in_trace:
        if span.get("name") == s.REPLICA_REQUEST and span_holds(span, start):
            return span
    return None


def routing_decision(engine: Span, in_trace: list[Span]) -> Span | None:
    """The trace's last routing decision made before the engine span began (a retried request
    is routed again: the earlier decisions did not lead to this engine span)."""
    arrival = epoch_seconds(engine["start_time"])
    decisions = [span for span in in_trace if span.get("name") == s.ROUTING_DECISION]
    made = [span for span in decisions if epoch_seconds(span["start_time"]) <= arrival]
    # None before it: the router's clock runs ahead of the replica's (another node); take the last.
    return max(made or decisions, key=lambda span: epoch_seconds(span["start_time"]), default=None)


def span_holds(span: Span, moment: float) -> bool:
    end = span.get("end_time")
    return epoch_seconds(span["start_time"]) <= moment <= (epoch_seconds(end) if end else moment)


def first_of(key: str, *sources: Span | None) -> Any:
    """The attribute from the first span that has it: the replica's own span, then the router's
    decision (which names the replica it chose), for a trace whose replica span is missing."""
    return next((v for span in sources if span and (v := attribute(span, key)) is not None), None)


def engine_timeline(engine: Span, replica: Span | None, decision: Span | None) -> RequestTimeline:
    arrival = epoch_seconds(engine["start_time"])
    queue, prefill = seconds(engine, s.ENGINE_QUEUE_S), seconds(engine, s.ENGINE_PREFILL_S)
    decode = seconds(engine, s.ENGINE_DECODE_S)
    end_time = engine.get("end_time")
    return RequestTimeline(
        request_id=attribute(engine, s.ENGINE_REQUEST_ID),
        trace_id=trace_id(engine),
        replica=first_of(s.REPLICA, replica, decision) or UNKNOWN_REPLICA,
        model=first_of(s.MODEL, replica, decision) or attribute(engine, "gen_ai.response.model"),
        arrival=arrival,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        end=epoch_seconds(end_time) if end_time else arrival + queue + prefill + decode,
        prompt_tokens=whole(attribute(engine, s.ENGINE_PROMPT_TOKENS)),
        completion_tokens=whole(attribute(engine, s.ENGINE_COMPLETION_TOKENS)),
        routing_policy=attribute(decision, s.ROUTING_POLICY) if decision else None,
        routing_reason=attribute(decision, s.ROUTING_REASON) if decision else None,
    )


def request_timelines(spans: Iterable[Span], last: int | None = None) -> list[RequestTimeline]:
    """A timeline per engine span, the `last` ones by arrival (all when None), oldest first."""
    spans = list(spans)
    by_id = {sid: span for span in spans if (sid := span_id(span))}
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(trace_id(span), []).append(span)
    engines = sorted(
        (span for span in spans if span.get("name") == s.ENGINE_REQUEST),
        key=lambda span: epoch_seconds(span["start_time"]),
    )
    if last is not None:
        engines = engines[-last:] if last > 0 else []
    timelines = []
    for engine in engines:
        in_trace = by_trace[trace_id(engine)]
        replica = replica_span(engine, by_id, in_trace)
        timelines.append(engine_timeline(engine, replica, routing_decision(engine, in_trace)))
    return timelines

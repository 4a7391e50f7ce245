"""Slow-request forensics (`llm-serving trace ID`): find a request's trace in Phoenix and print its
spans as a timeline, a tree by parent, each line with its offset from the trace's start, its
duration, a bar on the trace's time axis and the attributes that say where the time went (the
routing decision, the replica, vLLM's queue / prefill / decode split, tokens). Pure functions over
Phoenix's span JSON (serving/tracing/phoenix.py); the reader is injected, so tests need no backend."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from serving.tracing import spans as s
from serving.tracing.timeline import attribute, epoch_seconds, span_id, trace_id

Span = Mapping[str, Any]
SpanReader = Callable[..., list[dict[str, Any]]]  # serving.tracing.phoenix.read_spans
TRACE_ID = re.compile(r"[0-9a-f]{32}")
BAR_WIDTH = 40
SPAN_BAR, QUEUE_BAR, PREFILL_BAR, DECODE_BAR = "━", "░", "▒", "█"
LEGEND = f"{SPAN_BAR} span  {QUEUE_BAR} engine queue  {PREFILL_BAR} prefill  {DECODE_BAR} decode"

# Attributes shown after a span's name, in this order, when the span has them.
SHOWN: tuple[tuple[str, str], ...] = (
    ("model", s.MODEL),
    ("replica", s.REPLICA),
    ("policy", s.ROUTING_POLICY),
    ("reason", s.ROUTING_REASON),
    ("candidates", s.ROUTING_CANDIDATES),
    ("prefix_match", s.ROUTING_PREFIX_MATCH),
    ("load", s.ROUTING_LOAD_SCORE),
    ("session", s.ROUTING_SESSION),
    ("adapter", s.ROUTING_ADAPTER),
    ("request_id", s.REQUEST_ID),
    ("id", s.ENGINE_REQUEST_ID),
    ("status", s.HTTP_STATUS),
)
SHOWN_MS: tuple[tuple[str, str], ...] = (  # seconds in the span, shown in ms
    ("router_wait", s.ROUTING_QUEUED_S),
    ("queue", s.ENGINE_QUEUE_S),
    ("prefill", s.ENGINE_PREFILL_S),
    ("decode", s.ENGINE_DECODE_S),
    ("ttft", s.ENGINE_TTFT_S),
)


class TraceNotFound(LookupError):
    """No trace in the backend holds the id asked for."""


@dataclass(frozen=True)
class Found:
    trace_id: str
    others: list[str]  # further traces that carry the same request id (retries), newest first


def is_trace_id(ident: str) -> bool:
    return TRACE_ID.fullmatch(ident.lower()) is not None


def find_trace(read: SpanReader, url: str, project: str, ident: str) -> Found:
    """The trace of `ident`: a trace id, vLLM's request id (the response's `id`) or the client's
    X-Request-Id; the newest if several traces carry it."""
    if is_trace_id(ident):
        return Found(ident.lower(), [])
    for key in (s.ENGINE_REQUEST_ID, s.REQUEST_ID):
        matches = read(url, project, attributes={key: ident}, limit=100)
        trace_ids = list(dict.fromkeys(trace_id(span) for span in matches))
        if trace_ids:
            return Found(trace_ids[0], trace_ids[1:])
    raise TraceNotFound(
        f"no trace in project '{project}' at {url} holds the request id '{ident}' (as "
        f"{s.ENGINE_REQUEST_ID} or {s.REQUEST_ID}); spans reach the backend a few seconds after "
        "the request ends"
    )


def start_s(span: Span) -> float:
    return epoch_seconds(span["start_time"])


def end_s(span: Span) -> float:
    return epoch_seconds(span["end_time"])


def seconds_attr(span: Span, key: str) -> float | None:
    value = attribute(span, key)
    return float(value) if isinstance(value, (int, float)) else None


def tree(spans: Sequence[Span]) -> list[tuple[Span, str]]:
    """Spans in depth-first order with their tree prefix (`├─ `, `└─ `); a span whose parent is not
    in the trace (the client's own span, or one not exported) is a root. Siblings by start."""
    ids = {span_id(span) for span in spans} - {None}
    children: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.get("parent_id")
        children.setdefault(parent if parent in ids else None, []).append(span)
    for group in children.values():
        group.sort(key=start_s)
    ordered: list[tuple[Span, str]] = []

    def walk(parent: str | None, prefix: str) -> None:
        group = children.get(parent, [])
        for index, span in enumerate(group):
            last = index == len(group) - 1
            branch = "" if parent is None else ("└─ " if last else "├─ ")
            ordered.append((span, prefix + branch))
            deeper = "" if parent is None else ("   " if last else "│  ")
            if span_id(span) is not None:
                walk(span_id(span), prefix + deeper)

    walk(None, "")
    return ordered


def engine_phases(span: Span) -> list[tuple[float, str]]:
    """vLLM's split of its span: (seconds, bar character) for queue, prefill, decode."""
    phases = [
        (seconds_attr(span, s.ENGINE_QUEUE_S), QUEUE_BAR),
        (seconds_attr(span, s.ENGINE_PREFILL_S), PREFILL_BAR),
        (seconds_attr(span, s.ENGINE_DECODE_S), DECODE_BAR),
    ]
    return [(max(0.0, sec), char) for sec, char in phases if sec is not None]


def bar(span: Span, t0: float, total_s: float, width: int = BAR_WIDTH) -> str:
    """The span on the trace's time axis, `width` characters; vLLM's span shows its phases."""
    scale = width / total_s if total_s > 0 else 0.0
    first = min(width - 1, round((start_s(span) - t0) * scale))
    last = max(first + 1, min(width, round((end_s(span) - t0) * scale)))
    cells = [SPAN_BAR] * (last - first)
    if span.get("name") == s.ENGINE_REQUEST:
        at = start_s(span)
        for seconds, char in engine_phases(span):
            if seconds == 0:
                continue
            begin = round((at - t0) * scale) - first
            stop = round((at + seconds - t0) * scale) - first
            for cell in range(max(0, begin), min(len(cells), max(stop, begin + 1))):
                cells[cell] = char
            at += seconds
    return " " * first + "".join(cells) + " " * (width - last)


def shown_attributes(span: Span) -> str:
    parts = []
    for label, key in SHOWN:
        value = attribute(span, key)
        if value is not None and value != "":
            text = str(value)
            parts.append(f'{label}="{text}"' if " " in text else f"{label}={text}")
    for label, key in SHOWN_MS:
        seconds = seconds_attr(span, key)
        if seconds is not None:
            parts.append(f"{label}={seconds * 1000:.1f}ms")
    prompt = attribute(span, s.ENGINE_PROMPT_TOKENS)
    completion = attribute(span, s.ENGINE_COMPLETION_TOKENS)
    if prompt is not None or completion is not None:
        parts.append(f"tokens={prompt if prompt is not None else '?'}→{completion or 0}")
    if span.get("status_code") == "ERROR":
        parts.append(f'error="{span.get("status_message") or "?"}"')
    return "  ".join(parts)


def format_timeline(spans: Sequence[Span], width: int = BAR_WIDTH) -> list[str]:
    """The trace as lines: a header, one line per span (offset ms, duration ms, bar, tree, name,
    attributes) and the bars' legend."""
    if not spans:
        return []
    t0 = min(start_s(span) for span in spans)
    total_s = max(end_s(span) for span in spans) - t0
    started = datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    lines = [
        f"trace {trace_id(spans[0])}  {len(spans)} spans  {total_s * 1000:.1f} ms  "
        f"started {started} UTC",
        f"{'offset ms':>10} {'dur ms':>9}  {'':{width}}  span",
    ]
    for span, prefix in tree(spans):
        offset_ms = (start_s(span) - t0) * 1000
        duration_ms = (end_s(span) - start_s(span)) * 1000
        name = f"{prefix}{span.get('name', '?')}"
        details = shown_attributes(span)
        lines.append(
            f"{offset_ms:>10.1f} {duration_ms:>9.1f}  {bar(span, t0, total_s, width)}  {name}"
            + (f"  {details}" if details else "")
        )
    lines.append(f"{'':>10} {'':>9}  {LEGEND}")
    return lines

"""Reads spans back from a Phoenix server's REST API (`GET /v1/projects/{project}/spans`), for the
console's requests view and `llm-serving trace`. Each span is Phoenix's JSON: name, context
(trace_id, span_id), parent_id, start_time and end_time (ISO 8601), attributes (flat keys)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx

PAGE = 1000  # Phoenix's most spans per page
MAX_PAGES = 20  # bounds one read: at most 20,000 spans


class TraceBackendError(RuntimeError):
    """The trace backend could not be read (down, or refused the query): says which and why."""


def read_spans(
    query_url: str,
    project: str,
    *,
    trace_ids: Iterable[str] = (),
    names: Iterable[str] = (),
    attributes: dict[str, str] | None = None,
    start_time: str | None = None,
    limit: int = PAGE,
    timeout_s: float = 10.0,
) -> list[dict[str, Any]]:
    """Spans of `project`, the latest started first, filtered as Phoenix filters: by trace ids,
    span names, attribute values (`key:value`, exact string match) and a lower bound on the
    start (ISO 8601)."""
    params: list[tuple[str, str | int | float | bool | None]] = [("trace_id", t) for t in trace_ids]
    params += [("name", n) for n in names]
    # JSON-quoted: Phoenix parses the value as JSON, so an id like "12345" would match numbers only.
    params += [("attribute", f"{k}:{json.dumps(v)}") for k, v in (attributes or {}).items()]
    if start_time:
        params.append(("start_time", start_time))
    # Newest by start, not by arrival at Phoenix: a replica exports its batch of spans up to
    # seconds after another, and the last N requests are the last N that started.
    params += [("sort", "start_time"), ("order", "desc")]
    url = f"{query_url}/v1/projects/{project}/spans"
    spans: list[dict[str, Any]] = []
    cursor = None
    try:
        with httpx.Client(timeout=timeout_s) as client:
            for _ in range(MAX_PAGES):
                page = [*params, ("limit", min(PAGE, limit - len(spans)))]
                response = client.get(url, params=page + ([("cursor", cursor)] if cursor else []))
                if response.status_code == 404:
                    return []  # no span has reached the project yet
                response.raise_for_status()
                body = response.json()
                spans += body.get("data", [])
                cursor = body.get("next_cursor")
                if not cursor or len(spans) >= limit:
                    return spans
    except httpx.HTTPError as err:
        raise TraceBackendError(f"cannot read spans from {query_url}: {err}") from None
    return spans

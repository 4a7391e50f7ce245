"""The routing decision's span: written by the request router (serving/routing.py) in the model
router's process when Serve has placed a request on a replica, as a child of the router's span
(whose `traceparent` the request's RoutingHint carries). It spans the request's wait in the
router's queue, from Serve's pending request to the replica accepting it."""

from __future__ import annotations

import time
from typing import Any

from serving.tracing import spans
from serving.tracing.setup import context_of, tracer

NOTE = "llm_serving_decision"  # the attribute of Serve's PendingRequest holding the policy's why


def note_decision(pending_request: Any, reason: str, **attributes: str | int | float) -> None:
    """Keep why the policy ranked the replicas so (read when the request is placed)."""
    if tracer() is not None and pending_request is not None:
        setattr(pending_request, NOTE, {spans.ROUTING_REASON: reason, **attributes})


def decision_attributes(
    policy: str, replica: str, candidates: int, queued_s: float, note: dict[str, Any] | None
) -> dict[str, Any]:
    """The span's attributes: the policy, the chosen replica, why, and the wait for it."""
    return {
        spans.ROUTING_POLICY: policy,
        spans.REPLICA: replica,
        spans.ROUTING_CANDIDATES: candidates,
        spans.ROUTING_QUEUED_S: round(queued_s, 6),
        spans.ROUTING_REASON: f"{policy}: the replica Serve placed it on",
        **(note or {}),
    }


def record_decision(
    policy: str, pending_request: Any, replica_id: Any, candidates: int, hint: Any
) -> None:
    """Write the decision's span (when tracing is on and the request carries a trace)."""
    current = tracer()
    parent = getattr(hint, "traceparent", None)
    if current is None or not parent:
        return
    from opentelemetry.trace import SpanKind

    start_s = getattr(pending_request, "created_at", None) or time.time()
    now = time.time()
    attributes = decision_attributes(
        policy,
        replica_id.unique_id,
        candidates,
        now - start_s,
        getattr(pending_request, NOTE, None),
    )
    metadata = getattr(pending_request, "metadata", None)
    if adapter := getattr(metadata, "multiplexed_model_id", None):
        attributes[spans.ROUTING_ADAPTER] = adapter
    span = current.start_span(
        spans.ROUTING_DECISION,
        context=context_of(parent),
        kind=SpanKind.INTERNAL,
        start_time=int(start_s * 1e9),
        attributes=attributes,
    )
    span.end(end_time=int(now * 1e9))

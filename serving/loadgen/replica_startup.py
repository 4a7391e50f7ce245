"""A replica's start-up phases as the benches report them: the replica's own /health (`startup_s`
and the moments of `startup_at`), recounted from the moment Serve's controller started the replica
(the dashboard's `start_time_s`), which the replica cannot see. A worker process Ray started
before Serve asked (a standby worker) then counts from Serve's start, not from its own."""

from __future__ import annotations

from typing import Any

from serving.engines.vllm_startup import startup_phases


def serve_start_time(deployment: dict[str, Any], replica_id: str) -> float | None:
    """When Serve's controller started the replica `replica_id` (epoch seconds; the latest
    replica when the id is empty or unknown)."""
    replicas = deployment.get("replicas") or []
    named = [r for r in replicas if replica_id and r.get("replica_id") == replica_id]
    times = [float(r["start_time_s"]) for r in named or replicas if r.get("start_time_s")]
    return max(times) if times else None


def serve_start_before(starts: list[float], health: dict[str, Any]) -> float | None:
    """Serve's start of the replica this /health came from, when replica ids are unknown: the
    latest start before its constructor ran (Serve starts a replica before constructing it)."""
    init = (health.get("startup_at") or {}).get("replica_init")
    earlier = [start for start in starts if init is not None and start <= float(init)]
    return max(earlier) if earlier else None


def replica_phases(health: dict[str, Any], serve_started: float | None) -> dict[str, float]:
    """The replica's startup_s, its named phases recounted from Serve's start of it."""
    at = {name: float(value) for name, value in (health.get("startup_at") or {}).items()}
    if serve_started is not None:
        at["serve_started"] = serve_started
    return {**(health.get("startup_s") or {}), **startup_phases(at)}

"""Memory of Serve replicas for the soak scenario: which processes are replicas (Ray's state API),
how much memory each holds (RSS of the replica and its children, e.g. vLLM's engine core, with
psutil), and whether it grew after warm-up beyond a bound (pure functions, unit-tested)."""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from serving.local.ray_access import use_token_auth

MIB = 1024**2
REPLICA_CLASS_PREFIX = "ServeReplica:"  # a replica actor's class: ServeReplica:APP:DEPLOYMENT
EDGE_SAMPLES = 3  # samples averaged (median) at each end, so one noisy reading does not decide


@dataclass(frozen=True)
class ReplicaProcess:
    replica: str  # APP/DEPLOYMENT/REPLICA_ID
    pid: int


@dataclass(frozen=True)
class ReplicaGrowth:
    """One replica's memory over a soak run, in MiB; None where too few samples say it."""

    replica: str
    samples: int
    after_warmup_mb: float | None  # median of the first samples at or after the warm-up
    end_mb: float | None  # median of the last samples
    growth_mb: float | None  # end - after warm-up
    peak_mb: float
    slope_mb_per_min: float | None  # least-squares trend after warm-up
    within_bound: bool | None  # growth <= bound; None when not measurable

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def replica_label(actor_name: str) -> str:
    """`SERVE_REPLICA::app#Deployment#id` -> `app/Deployment/id` (other names unchanged)."""
    return actor_name.removeprefix("SERVE_REPLICA::").replace("#", "/")


def list_replica_processes(dashboard_url: str) -> list[ReplicaProcess]:
    """Live Serve replica actors of the cluster behind the Ray dashboard, with their PIDs."""
    from ray.util.state import list_actors

    use_token_auth()  # the platform's Ray head refuses a caller without its token
    actors = list_actors(
        address=dashboard_url,
        filters=[("state", "=", "ALIVE")],
        limit=10_000,
        raise_on_missing_output=False,
        timeout=10,
    )
    return [
        ReplicaProcess(replica_label(actor.name or actor.actor_id), actor.pid)
        for actor in actors
        if (actor.class_name or "").startswith(REPLICA_CLASS_PREFIX) and actor.pid
    ]


def process_tree_rss_mb(pid: int) -> float | None:
    """RSS of a process and all its descendants in MiB; None when the process is gone.
    Pages shared between them count in each: the sum is an upper bound, steady if nothing leaks."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):  # a child may exit between listing and reading
            total += process.memory_info().rss
    return total / MIB


def sampling_interval_s(duration_s: float) -> float:
    """About 100 samples per run, between one per second and one per 10 s."""
    return min(10.0, max(1.0, duration_s / 100))


def default_warmup_s(duration_s: float) -> float:
    """A quarter of the run, at most 2 minutes: caches, allocator pools and JIT settle first."""
    return min(120.0, duration_s / 4)


def least_squares_slope(points: list[tuple[float, float]]) -> float | None:
    """Slope of y over x (per x unit); None for fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def replica_growth(
    replica: str,
    series: list[tuple[float, float]],
    warmup_s: float,
    bound_mb: float,
    edge: int = EDGE_SAMPLES,
) -> ReplicaGrowth:
    """Growth of one replica's memory (`series` = (seconds, MiB) in time order) after warm-up."""
    settled = [(t, mb) for t, mb in series if t >= warmup_s]
    peak = max((mb for _, mb in series), default=0.0)
    if len(settled) < 2:  # nothing to compare: the run (or the replica's life) was too short
        return ReplicaGrowth(replica, len(series), None, None, None, peak, None, None)
    n = min(edge, len(settled) // 2)
    start = statistics.median(mb for _, mb in settled[:n])
    end = statistics.median(mb for _, mb in settled[-n:])
    slope = least_squares_slope(settled)
    growth = end - start
    return ReplicaGrowth(
        replica,
        len(series),
        round(start, 1),
        round(end, 1),
        round(growth, 1),
        round(peak, 1),
        None if slope is None else round(slope * 60, 2),
        growth <= bound_mb,
    )


def growth_by_replica(
    samples: list[tuple[float, str, float]], warmup_s: float, bound_mb: float
) -> list[ReplicaGrowth]:
    """`samples` = (seconds, replica, MiB) in time order -> one growth figure per replica."""
    series: dict[str, list[tuple[float, float]]] = {}
    for t, replica, mb in samples:
        series.setdefault(replica, []).append((t, mb))
    return [replica_growth(name, series[name], warmup_s, bound_mb) for name in sorted(series)]


def memory_held(growths: list[ReplicaGrowth]) -> bool:
    """The gate: at least one replica measured, and none grew beyond the bound."""
    measured = [g for g in growths if g.within_bound is not None]
    return bool(measured) and all(g.within_bound for g in measured)

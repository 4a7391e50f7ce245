"""The autoscale scenario's timeline: pure functions over the replica samples it took, which say
when Serve decided to scale up, when a second replica served, and how long the way back took."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplicaSample:
    t: float  # seconds since the burst started
    running: int
    starting: int  # STARTING/UPDATING/RECOVERING: asked for, not serving yet
    stopping: int
    target: int  # Serve's target replica count (the autoscaler's decision)


def replica_sample(t: float, deployment: dict[str, Any]) -> ReplicaSample:
    states = Counter(replica["state"] for replica in deployment.get("replicas", []))
    running, stopping = states.pop("RUNNING", 0), states.pop("STOPPING", 0)
    return ReplicaSample(
        t, running, sum(states.values()), stopping, int(deployment["target_num_replicas"])
    )


def first_time(
    samples: list[ReplicaSample], after: float, holds: Callable[[ReplicaSample], bool]
) -> float | None:
    return next((s.t for s in samples if s.t >= after and holds(s)), None)


def scale_up_decided_at(samples: list[ReplicaSample], start: float = 0.0) -> float | None:
    """When Serve first wanted 2+ replicas: a higher target or a replica STARTING."""
    return first_time(samples, start, lambda s: s.target >= 2 or s.running + s.starting >= 2)


def second_replica_serving_at(samples: list[ReplicaSample], start: float = 0.0) -> float | None:
    return first_time(samples, start, lambda s: s.running >= 2)


def scale_down_decided_at(samples: list[ReplicaSample], load_end: float) -> float | None:
    return first_time(samples, load_end, lambda s: s.target <= 1)


def back_to_one_at(samples: list[ReplicaSample], load_end: float) -> float | None:
    """One replica serving, none starting or stopping, and Serve wants no more."""
    return first_time(
        samples,
        load_end,
        lambda s: (s.running, s.starting, s.stopping) == (1, 0, 0) and s.target <= 1,
    )


def _since(at: float | None, origin: float | None) -> float | None:
    return None if at is None or origin is None else round(at - origin, 2)


def figures(samples: list[ReplicaSample], load_end: float | None) -> dict[str, float | None]:
    """Scale-up times from the burst's start (t = 0); scale-down times from the load's end.
    Scale-down counts only after a scale-up happened."""
    up = second_replica_serving_at(samples)
    end = None if up is None or load_end is None else max(load_end, up)
    return {
        "scale_up_decision_s": _since(scale_up_decided_at(samples), 0.0),
        "second_replica_serving_s": _since(up, 0.0),
        "load_duration_s": None if load_end is None else round(load_end, 2),
        "scale_down_decision_s": _since(
            None if end is None else scale_down_decided_at(samples, end), load_end
        ),
        "back_to_one_s": _since(None if end is None else back_to_one_at(samples, end), load_end),
    }

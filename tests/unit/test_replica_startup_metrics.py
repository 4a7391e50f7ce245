"""A replica's start-up phases as Ray metrics and in /health: one gauge named once, a `phase`
label per phase, the same names as /health's startup_s (Ray's metric classes faked)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ray.util import metrics as ray_metrics

from serving import metrics
from serving.api.health import health_body
from serving.engines.base import EngineStats
from serving.engines.vllm import record_first_token
from serving.engines.vllm_startup import STARTUP_PHASES


class FakeMetric:
    made: dict[str, FakeMetric] = {}

    def __init__(self, name: str, description: str = "", tag_keys: tuple = (), **_: Any) -> None:
        self.name, self.tag_keys = name, tag_keys
        self.values: dict[tuple, float] = {}
        FakeMetric.made[name] = self

    def set_default_tags(self, tags: dict[str, str]) -> None:
        self.default_tags = tags

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.values[tuple(sorted((tags or {}).items()))] = value

    inc = observe = set


@pytest.fixture
def platform_metrics(monkeypatch: pytest.MonkeyPatch) -> metrics.PlatformMetrics:
    for kind in ("Gauge", "Counter", "Histogram"):
        monkeypatch.setattr(ray_metrics, kind, FakeMetric)
    FakeMetric.made = {}
    return metrics.PlatformMetrics(metrics.MetricLabels("vllm", "m", "VLLMServer", "r1"))


def test_each_phase_is_one_labelled_value_of_the_startup_gauge(platform_metrics) -> None:
    platform_metrics.record_startup({"imports": 9.0, "first_request_served": 17.25})
    platform_metrics.recorder.flush()
    gauge = FakeMetric.made["llm_serving_replica_startup_seconds"]
    assert gauge.tag_keys == (*metrics.LABELS, "phase")
    assert gauge.default_tags["replica"] == "r1"
    assert gauge.values == {
        (("phase", "imports"),): 9.0,
        (("phase", "first_request_served"),): 17.25,
    }
    assert "first_request_served" in metrics.DESCRIPTIONS[metrics.REPLICA_STARTUP]
    assert all(phase in metrics.DESCRIPTIONS[metrics.REPLICA_STARTUP] for phase in STARTUP_PHASES)


def test_the_phases_are_set_again_with_every_engine_report(platform_metrics) -> None:
    """Ray exports a gauge only while it is set: a phase set once at start-up left the scrapes."""
    from serving.engines.base import EngineStats

    platform_metrics.record_startup({"imports": 9.0})
    platform_metrics.recorder.flush()
    gauge = FakeMetric.made["llm_serving_replica_startup_seconds"]
    gauge.values.clear()  # as if the exporter had dropped the series
    platform_metrics.record_engine(EngineStats(running=0, waiting=0))
    platform_metrics.recorder.flush()
    assert gauge.values == {(("phase", "imports"),): 9.0}


def test_the_first_token_closes_the_startup_once(platform_metrics) -> None:
    startup_at = {"process_created": 100.0, "replica_ready": 110.0}
    record_first_token(startup_at, platform_metrics, SimpleNamespace(time_to_first_tokens_iter=[]))
    assert "first_token" not in startup_at  # a step without a first token
    record_first_token(startup_at, platform_metrics, SimpleNamespace(time_to_first_tokens_iter=[1]))
    first = startup_at["first_token"]
    record_first_token(startup_at, platform_metrics, SimpleNamespace(time_to_first_tokens_iter=[1]))
    assert startup_at["first_token"] == first > 110.0
    platform_metrics.recorder.flush()
    values = FakeMetric.made["llm_serving_replica_startup_seconds"].values
    assert set(values) == {(("phase", "first_token"),), (("phase", "first_request_served"),)}


def test_health_carries_the_named_phases_and_their_moments() -> None:
    engine = SimpleNamespace(
        model_name="m",
        stats=lambda: EngineStats(running=0, waiting=0),
        startup_timings={"import_vllm": 7.0},
        startup_at={"process_created": 100.0, "replica_init": 101.0, "engine_process_up": 110.5},
    )
    body = health_body(engine, None)
    assert body["startup_s"] == {"import_vllm": 7.0, "process_up": 1.0, "imports": 9.5}
    assert body["startup_at"]["process_created"] == 100.0


def test_an_engine_without_moments_keeps_its_timings() -> None:
    engine = SimpleNamespace(
        model_name="hf", stats=lambda: EngineStats(running=0, waiting=0), startup_timings={}
    )
    assert (health_body(engine, None)["startup_s"], health_body(engine, None)["startup_at"]) == (
        {},
        {},
    )

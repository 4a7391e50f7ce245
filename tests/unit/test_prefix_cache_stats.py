"""Prefix-cache hit rates: vLLM's per-step lookups summed in the engine snapshot, and read back
per replica from a Prometheus page for `llm-serving status`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from serving.engines.base import EngineStats
from serving.engines.vllm import SchedulerSnapshot, record_prefix_cache
from serving.metrics import prefix_cache_by_replica

PAGE = """\
# HELP ray_llm_serving_prefix_cache_queries_total Prompt tokens looked up.
# TYPE ray_llm_serving_prefix_cache_queries_total counter
ray_llm_serving_prefix_cache_queries_total{model="a",replica="r1",engine="vllm"} 1000.0
ray_llm_serving_prefix_cache_queries_total{model="a",replica="r2",engine="vllm"} 400.0
# HELP ray_llm_serving_prefix_cache_hits_total Prompt tokens found.
# TYPE ray_llm_serving_prefix_cache_hits_total counter
ray_llm_serving_prefix_cache_hits_total{model="a",replica="r1",engine="vllm"} 750.0
"""


@dataclass
class Step:
    queries: int
    hits: int


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def record_prefix_cache(self, queries: int, hits: int) -> None:
        self.calls.append((queries, hits))


def test_steps_add_up_and_empty_steps_are_skipped() -> None:
    snapshot, metrics = SchedulerSnapshot(), Recorded()
    for step in (Step(100, 0), Step(0, 0), Step(120, 96), None):
        record_prefix_cache(snapshot, metrics, step)  # type: ignore[arg-type]  # a stand-in PlatformMetrics
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (220, 96)
    assert metrics.calls == [(100, 0), (120, 96)]


def test_hit_rate_of_engine_stats() -> None:
    assert (
        EngineStats(0, 0, prefix_cache_queries=200, prefix_cache_hits=50).prefix_cache_hit_rate
        == 0.25
    )
    assert EngineStats(0, 0).prefix_cache_hit_rate is None


def test_hit_rates_per_replica_from_a_prometheus_page() -> None:
    rows = prefix_cache_by_replica(PAGE)
    assert rows[("a", "r1")] == (1000.0, 750.0)
    assert rows[("a", "r2")] == pytest.approx((400.0, 0.0))


def test_adapter_loads_during_a_run_are_the_counter_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from serving.loadgen import server_counters

    page = (
        "# TYPE ray_llm_serving_adapter_loads_total counter\n"
        'ray_llm_serving_adapter_loads_total{adapter="a",model="m",replica="r1"} 3.0\n'
        'ray_llm_serving_adapter_loads_total{adapter="b",model="m",replica="r2"} 1.0\n'
    )
    before = {("a", "m", "r1"): 2.0, ("b", "m", "r2"): 1.0}
    monkeypatch.setattr(server_counters, "EXPORT_LAG_S", 0.0)
    monkeypatch.setattr(
        server_counters,
        "read_adapter_loads",
        lambda url: server_counters.counter_values(
            page, server_counters.ADAPTER_LOADS, ("adapter", "model", "replica")
        ),
    )
    rows = server_counters.loads_during(before, "http://127.0.0.1:1/metrics")
    assert rows == [{"adapter": "a", "model": "m", "replica": "r1", "loads": 1}]
    assert server_counters.loads_during(None, "http://127.0.0.1:1/metrics") is None


def test_adapters_are_the_model_cards_with_a_parent() -> None:
    from serving.loadgen.server_counters import adapter_ids

    body = {
        "data": [
            {"id": "base", "parent": None},
            {"id": "sql-lora", "parent": "base"},
            {"id": "other"},
        ]
    }
    assert adapter_ids(body) == {"sql-lora"}
    assert adapter_ids({}) == set()

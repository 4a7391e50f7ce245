"""Every series the Grafana dashboard reads exists from a replica's start (issue 38, point 4): the
dashboard's own expressions name them, and each is an engine gauge set with every report, a
counter exported at 0 when the replica starts, or a histogram, which Ray's metrics agent cannot
export before its first observation (those panels say why they are empty). Ray's metric classes
are faked; tests/integration/test_observability.py checks a real scrape."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from ray.util import metrics as ray_metrics

from serving import metrics
from serving.k8s import CHART_DIR
from tests.promql import dashboard_metric_names

DASHBOARD = json.loads((CHART_DIR / "dashboards" / "llm-serving.json").read_text())
PREFIX = "ray_"
PLATFORM_PREFIX = f"{PREFIX}llm_serving_"
HISTOGRAM_SERIES = re.compile(r"_(bucket|count|sum)$")


def dashboard_series() -> set[str]:
    """The platform's series the panels and the variables (label_values queries) read."""
    variables = {
        name
        for variable in DASHBOARD["templating"]["list"]
        for name in re.findall(r"label_values\(\s*(\w+)", str(variable.get("definition", "")))
    }
    return {n for n in dashboard_metric_names(DASHBOARD) | variables if n.startswith(PREFIX)}


def metric_of(series: str) -> str:
    """The metric (serving.metrics' name) a scraped series belongs to."""
    name = series.removeprefix(PREFIX)
    base = HISTOGRAM_SERIES.sub("", name)
    return base if base in metrics.HISTOGRAMS else name


def status_patterns() -> list[str]:
    exprs = [t["expr"] for panel in DASHBOARD["panels"] for t in panel.get("targets", [])]
    return [p for expr in exprs for p in re.findall(r'status=~?"([^"]*)"', expr)]


def test_the_dashboard_reads_platform_series() -> None:
    series = dashboard_series()
    assert {f"{PREFIX}{metrics.PREFIX_CACHE_HITS}", f"{PREFIX}{metrics.REQUESTS}"} <= series
    assert all(
        metric_of(s) in metrics.DESCRIPTIONS for s in series if s.startswith(PLATFORM_PREFIX)
    )


def test_every_platform_series_the_dashboard_reads_exists_from_a_replicas_start() -> None:
    exported = metrics.counters_at_start("vllm", ("an-adapter",), ("default",))
    at_start = {name for name, _ in exported}
    at_start |= set(metrics.ENGINE_GAUGES)
    read = {metric_of(s) for s in dashboard_series() if s.startswith(PLATFORM_PREFIX)}
    assert read - set(metrics.HISTOGRAMS) <= at_start, read - at_start


def test_panels_of_histograms_say_why_they_are_empty() -> None:
    """Ray exports no empty histogram, and a quantile of no requests has no value anyway."""
    for panel in DASHBOARD["panels"]:
        names = dashboard_metric_names({"panels": [panel]})
        if any(metric_of(name) in metrics.HISTOGRAMS for name in names):
            assert panel["fieldConfig"]["defaults"].get("noValue"), panel["title"]


def test_each_status_filter_of_the_dashboard_matches_a_status_counted_from_the_start() -> None:
    patterns = status_patterns()
    assert patterns, "the Errors panel filters on status"
    for pattern in patterns:
        assert any(re.fullmatch(pattern, s) for s in metrics.STATUSES_AT_START), pattern


class FakeMetric:
    def __init__(self, name: str, description: str = "", tag_keys: tuple = (), **_: Any) -> None:
        self.name = name
        self.recorded: list[tuple[float, dict[str, str]]] = []

    def set_default_tags(self, tags: dict[str, str]) -> None:
        self.default_tags = tags


class FakeCounter(FakeMetric):
    made: dict[str, FakeCounter] = {}

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        FakeCounter.made[f"{name}_total"] = self  # Ray appends `_total` when it exports

    def _record(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.recorded.append((value, {**self.default_tags, **(tags or {})}))


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeCounter]:
    monkeypatch.setattr(ray_metrics, "Counter", FakeCounter)
    monkeypatch.setattr(ray_metrics, "Gauge", FakeMetric)
    monkeypatch.setattr(ray_metrics, "Histogram", FakeMetric)
    FakeCounter.made = {}
    return FakeCounter.made


def zeros(made: dict[str, FakeCounter]) -> dict[str, list[dict[str, str]]]:
    """Counter -> the label sets it was recorded at 0 for."""
    return {name: [tags for value, tags in c.recorded if value == 0] for name, c in made.items()}


def test_a_vllm_replica_exports_its_counters_at_zero_for_every_label_set(fake_ray) -> None:
    labels = metrics.MetricLabels("vllm", "m", "VLLMServer", "r1")
    tenants = ("default", "team-a")
    metrics.PlatformMetrics(labels, adapters=("a1", "a2"), tenants=tenants).recorder.flush()
    exported = zeros(fake_ray)
    own = labels.as_tags()
    assert exported[metrics.REQUESTS] == [{**own, "status": s} for s in metrics.STATUSES_AT_START]
    assert exported[metrics.ADAPTER_LOADS] == [{**own, "adapter": a} for a in ("a1", "a2")]
    for name in (metrics.PREFIX_CACHE_HITS, metrics.PREFIX_CACHE_QUERIES, metrics.PROMPT_TOKENS):
        assert exported[name] == [own], name
    for name in metrics.TENANT_TOKENS:
        assert exported[name] == [{**own, "tenant": t, "adapter": ""} for t in tenants], name


def test_the_hf_baseline_exports_no_prefix_cache_it_does_not_have(fake_ray) -> None:
    labels = metrics.MetricLabels("hf", "m", "HFBaseline", "r1")
    metrics.PlatformMetrics(labels).recorder.flush()
    exported = zeros(fake_ray)
    assert exported[metrics.PREFIX_CACHE_HITS] == exported[metrics.ADAPTER_LOADS] == []
    assert len(exported[metrics.REQUESTS]) == len(metrics.STATUSES_AT_START)
    assert exported[metrics.GENERATION_TOKENS] == [labels.as_tags()]

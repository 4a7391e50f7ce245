"""`llm-serving bench --model-mix`: requests spread over models by weight (the same draw for
every target), and the summary and report break the figures down per model."""

from __future__ import annotations

from collections import Counter

import pytest

from serving.loadgen import metrics
from serving.loadgen import workloads as wl
from serving.loadgen.client import RequestOptions, RequestResult, request_kwargs
from serving.loadgen.scenarios import sweep_report as report


def test_a_mix_parses_to_weights_and_rejects_bad_items() -> None:
    assert wl.parse_model_mix("base=3, lora-a=1,tiny") == {"base": 3.0, "lora-a": 1.0, "tiny": 1.0}
    for bad in ("a=0", "a=x", "=2", "a=1,a=2"):
        with pytest.raises(wl.WorkloadError, match="--model-mix"):
            wl.parse_model_mix(bad)


def test_models_are_drawn_by_weight_and_the_draw_is_seeded() -> None:
    specs = wl.seed_requests(400, 8)
    mixed = wl.assign_models(specs, {"a": 3, "b": 1}, seed=7)
    assert mixed == wl.assign_models(specs, {"a": 3, "b": 1}, seed=7)
    counts = Counter(spec.model for spec in mixed)
    assert 250 < counts["a"] < 350 and counts["a"] + counts["b"] == 400
    assert [s.prompt for s in mixed] == [s.prompt for s in specs]


def test_a_request_asks_for_its_own_model() -> None:
    spec = wl.assign_models(wl.seed_requests(1, 8), {"lora-a": 1}, seed=0)[0]
    assert request_kwargs(RequestOptions("base"), spec)["model"] == "lora-a"
    assert request_kwargs(RequestOptions("base"), wl.seed_requests(1, 8)[0])["model"] == "base"


def done(model: str, ttft: float) -> RequestResult:
    return RequestResult(
        True,
        prompt_len=10,
        output_tokens=4,
        ttft=ttft,
        itl=[0.01] * 3,
        latency=ttft + 0.03,
        model=model,
    )


def test_the_summary_and_report_break_figures_down_per_model() -> None:
    results = [done("a", 0.1), done("a", 0.3), done("b", 0.5)]
    summary = metrics.summarize(results, 2.0)
    assert summary["per_model"]["a"]["completed"] == 2
    assert summary["per_model"]["a"]["median_ttft_ms"] == pytest.approx(200.0)
    assert summary["per_model"]["b"]["output_throughput"] == pytest.approx(2.0)
    assert "per_model" not in metrics.summarize(results[:2], 2.0)  # one model: no breakdown
    document = {"levels": [{"label": "c2", "results": {"platform": summary}}]}
    assert [row[2] for row in report.model_rows(document)] == ["a", "b"]

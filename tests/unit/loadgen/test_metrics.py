"""Metric maths on recorded streams: the numbers vLLM's `bench serve` would report for them."""

from __future__ import annotations

import pytest

from serving.loadgen import metrics
from serving.loadgen.client import NOT_STARTED, RequestResult

VLLM_FIELDS = {
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrent_requests",
    *(
        f"{stat}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p90", "p99")
    ),
}


def recorded() -> list[RequestResult]:
    """Three answers of 5 tokens (4 gaps each), one HTTP 503, one request never started."""
    return [
        RequestResult(
            True,
            prompt_len=10,
            output_tokens=5,
            ttft=0.1,
            itl=[0.01] * 4,
            latency=0.14,
            start_time=0.0,
        ),
        RequestResult(
            True,
            prompt_len=20,
            output_tokens=5,
            ttft=0.2,
            itl=[0.02] * 4,
            latency=0.28,
            start_time=0.05,
        ),
        RequestResult(
            True,
            prompt_len=30,
            output_tokens=5,
            ttft=0.3,
            itl=[0.03] * 4,
            latency=0.42,
            start_time=1.0,
        ),
        RequestResult(False, status="http_503", error="queue full", latency=0.01, start_time=0.1),
        RequestResult(False, status=NOT_STARTED),
    ]


def test_percentile_interpolates_linearly_like_numpy() -> None:
    assert metrics.percentile([1, 2, 3, 4], 50) == 2.5
    assert metrics.percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert metrics.percentile([], 99) == 0.0


def test_tpot_excludes_the_first_token() -> None:
    result = RequestResult(True, output_tokens=5, ttft=0.1, latency=0.5)
    assert metrics.tpot(result) == pytest.approx(0.1)
    assert metrics.tpot(RequestResult(True, output_tokens=1, ttft=0.1, latency=0.1)) is None


def test_summary_has_vllm_bench_serve_field_names() -> None:
    summary = metrics.summarize(recorded(), 2.0, {"ttft": 250})
    assert summary.keys() >= VLLM_FIELDS


def test_summary_counts_and_throughputs() -> None:
    summary = metrics.summarize(recorded(), 2.0)
    assert summary["num_prompts"] == 5
    assert (summary["completed"], summary["failed"], summary["not_started"]) == (3, 1, 1)
    assert summary["failures"] == {"http_503": 1}
    assert summary["total_input_tokens"] == 60
    assert summary["total_output_tokens"] == 15
    assert summary["request_throughput"] == pytest.approx(1.5)
    assert summary["output_throughput"] == pytest.approx(7.5)
    assert summary["total_token_throughput"] == pytest.approx(37.5)
    assert summary["request_goodput"] is None  # no SLO given


def test_summary_latency_distributions_in_ms() -> None:
    summary = metrics.summarize(recorded(), 2.0)
    assert summary["mean_ttft_ms"] == pytest.approx(200)
    assert summary["median_ttft_ms"] == pytest.approx(200)
    assert summary["p99_ttft_ms"] == pytest.approx(298)
    assert summary["mean_tpot_ms"] == pytest.approx(20)  # (latency - ttft) / 4
    assert summary["median_itl_ms"] == pytest.approx(20)  # the 12 gaps pooled
    assert summary["p90_e2el_ms"] == pytest.approx(392)


def test_goodput_counts_requests_within_every_slo() -> None:
    assert metrics.summarize(recorded(), 2.0, {"ttft": 250})["request_goodput"] == pytest.approx(
        1.0
    )
    both = metrics.summarize(recorded(), 2.0, {"ttft": 250, "tpot": 15})
    assert both["request_goodput"] == pytest.approx(0.5)
    assert metrics.summarize(recorded(), 2.0, {"e2el": 1})["request_goodput"] == 0


def test_max_concurrent_sweeps_start_and_end_times() -> None:
    assert metrics.max_concurrent(recorded()[:3]) == 2
    back_to_back = [
        RequestResult(True, start_time=0, latency=1),
        RequestResult(True, start_time=1, latency=1),
    ]
    assert metrics.max_concurrent(back_to_back) == 1


def test_empty_run_has_zero_latencies_not_errors() -> None:
    summary = metrics.summarize([RequestResult(False, status="connection")], 1.0)
    assert summary["completed"] == 0 and summary["failed"] == 1
    assert summary["median_ttft_ms"] == 0.0


def test_parse_slo() -> None:
    assert metrics.parse_slo("ttft:500,tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    assert metrics.parse_slo(None) == {}
    for bad in ("ttft", "ttfb:5", "tpot:fast", "ttft:-1", "ttft:nan"):
        with pytest.raises(metrics.SLOError):
            metrics.parse_slo(bad)


def test_ratios_and_millisecond_differences() -> None:
    subject = {"output_throughput": 300.0, "median_ttft_ms": 12.0, "label": "x", "failures": {}}
    other = {"output_throughput": 100.0, "median_ttft_ms": 10.0, "label": "y", "failures": {}}
    out = metrics.ratios(subject, other)
    assert out["output_throughput_ratio"] == pytest.approx(3.0)
    assert out["median_ttft_ms_ratio"] == pytest.approx(1.2)
    assert out["median_ttft_ms_diff"] == pytest.approx(2.0)
    assert "label_ratio" not in out and "output_throughput_diff" not in out
    assert metrics.ratios({"a": 1.0}, {"a": 0.0}) == {"a_ratio": None}


def test_raw_fields_are_per_request_lists() -> None:
    raw = metrics.raw_fields(recorded())
    assert raw["output_lens"] == [5, 5, 5, 0, 0]
    assert raw["errors"][3] == "queue full"
    assert len(raw["itls"]) == 5

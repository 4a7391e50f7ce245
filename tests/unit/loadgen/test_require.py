"""`--require` expressions: parsing, checking against the plan, evaluating against a result."""

from __future__ import annotations

import pytest

from serving.loadgen import require as rq


def document() -> dict:
    def result(throughput: float, ttft: float, running: int | None) -> dict:
        return {
            "output_throughput": throughput,
            "median_ttft_ms": ttft,
            "server": {"max_running": running, "batching": None},
        }

    return {
        "targets": [{"name": "vllm"}, {"name": "hf"}, {"name": "peer"}],
        "levels": [
            {
                "label": "c1",
                "results": {
                    "vllm": result(10, 5, 1),
                    "hf": result(8, 6, 1),
                    "peer": result(10, 4, None),
                },
                "ratios": {
                    "hf": {"output_throughput_ratio": 1.25},
                    "peer": {"output_throughput_ratio": 1.0},
                },
            },
            {
                "label": "c4",
                "results": {
                    "vllm": result(40, 9, 4),
                    "hf": result(10, 30, 1),
                    "peer": result(40, 8, None),
                },
                "ratios": {
                    "hf": {"output_throughput_ratio": 4.0, "median_ttft_ms_diff": -21.0},
                    "peer": {"output_throughput_ratio": None},
                },
            },
        ],
    }


def check(text: str) -> rq.Check:
    return rq.evaluate([rq.parse_requirement(text)], document())[0]


def test_parse_full_form() -> None:
    req = rq.parse_requirement(" hf.output_throughput_ratio@c16 >= 3 ")
    assert (req.target, req.metric, req.level, req.op, req.threshold) == (
        "hf",
        "output_throughput_ratio",
        "c16",
        ">=",
        3.0,
    )
    assert (
        rq.parse_requirement("mean_ttft_ms@8<1e3").level == "c8"
    )  # a bare number is a concurrency


@pytest.mark.parametrize("bad", ["output_throughput_ratio", "x >= fast", ">= 3", "a=>3", "a>=3 b"])
def test_parse_rejects_malformed(bad: str) -> None:
    with pytest.raises(rq.RequireError, match="expected"):
        rq.parse_requirement(bad)


def test_split_accepts_commas_and_repeats() -> None:
    assert rq.split_expressions(("a>=1, b<2", "c==3")) == ["a>=1", "b<2", "c==3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("throughput_ratio>=3", "unknown metric"),
        ("output_throughput_diff>=3", "_ms fields only"),
        ("tgi.output_throughput>=1", "no target"),
        ("output_throughput@c64>=1", "no level"),
        ("vllm.output_throughput_ratio>=1", "another target"),
    ],
)
def test_validate_fails_before_the_run(text: str, message: str) -> None:
    with pytest.raises(rq.RequireError, match=message):
        rq.validate([rq.parse_requirement(text)], ["vllm", "hf"], ["c1", "c4"])


def test_validate_needs_two_targets_for_a_ratio() -> None:
    with pytest.raises(rq.RequireError, match="two targets"):
        rq.validate([rq.parse_requirement("output_throughput_ratio>=3")], ["vllm"], ["c1"])


def test_validate_accepts_known_metrics() -> None:
    texts = [
        "output_throughput_ratio>=3",
        "p99_itl_ms<100",
        "max_running@c4>1",
        "median_ttft_ms_diff<=10",
        "request_goodput>0",
        "hf.completed==8",
    ]
    rq.validate([rq.parse_requirement(t) for t in texts], ["vllm", "hf"], ["c1", "c4"])


def test_ratio_defaults_to_the_second_target_at_the_last_level() -> None:
    result = check("output_throughput_ratio>=3")
    assert result.passed and result.actual == 4.0 and result.where == "vllm vs hf @ c4"
    assert not check("output_throughput_ratio@c1>=3").passed
    assert check("peer.output_throughput_ratio@1>=1").passed


def test_plain_metric_defaults_to_the_subject_and_reads_server_fields() -> None:
    assert check("output_throughput>=40").passed
    assert check("hf.median_ttft_ms>20").passed
    assert check("max_running@c4>1").passed
    assert not check("hf.max_running>1").passed


def test_unmeasured_figure_fails() -> None:
    result = check("peer.output_throughput_ratio>=1")
    assert not result.passed and result.actual is None
    assert "not measured" in rq.describe(result) and rq.describe(result).startswith("MISS")

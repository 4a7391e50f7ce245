"""The soak scenario without a platform: its report and verdict from given samples, and the
command's bad input (one `error:` line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from serving.cli import main
from serving.loadgen.client import RequestOptions, RequestResult, Target
from serving.loadgen.report import write_report
from serving.loadgen.scenarios import soak
from serving.loadgen.workloads import RequestSpec


def plan(bound_mb: float = 100.0) -> soak.SoakPlan:
    return soak.SoakPlan(
        Target("platform", "http://127.0.0.1:1/v1"),
        "http://127.0.0.1:2",
        "tiny",
        [RequestSpec("hi", 4)],
        RequestOptions("tiny"),
        concurrency=2,
        duration_s=40.0,
        warmup_s=10.0,
        interval_s=1.0,
        max_growth_mb=bound_mb,
    )


def run(leak_mb_per_s: float, failed: int = 0) -> soak.SoakRun:
    replicas = (("vllm/VLLMServer/a", 900.0, leak_mb_per_s), ("hf/HFBaseline/b", 400.0, 0.0))
    samples = [
        (float(t), name, base + leak * t) for t in range(40) for name, base, leak in replicas
    ]
    results = [RequestResult(success=True, output_tokens=4) for _ in range(20)]
    results += [RequestResult(success=False, status="http_503") for _ in range(failed)]
    return soak.SoakRun(results, samples, elapsed_s=40.0)


def test_steady_memory_and_no_failure_passes(tmp_path: Path) -> None:
    document = soak.soak_document(plan(), run(leak_mb_per_s=0.0))
    assert document["passed"] and document["memory_held"]
    assert document["requests"] == {
        "completed": 20,
        "failed": 0,
        "failures": {},
        "output_tokens": 80,
        "request_throughput": 0.5,
    }
    write_report(soak.report(document), tmp_path)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["replicas"][0]["replica"] == "hf/HFBaseline/b"
    assert (
        "| vllm/VLLMServer/a | 40 | 900.0 | 900.0 | 0.0 |" in (tmp_path / "summary.md").read_text()
    )
    assert (tmp_path / "memory.png").stat().st_size > 5_000


def test_growth_beyond_the_bound_or_a_failed_request_fails() -> None:
    leaking = soak.soak_document(plan(bound_mb=100.0), run(leak_mb_per_s=5.0))  # ~140 MiB in 28 s
    assert not leaking["memory_held"] and not leaking["passed"]
    assert [r["within_bound"] for r in leaking["replicas"]] == [True, False]
    failing = soak.soak_document(plan(), run(leak_mb_per_s=0.0, failed=2))
    assert failing["memory_held"] and not failing["passed"]
    assert failing["requests"]["failures"] == {"http_503": 2}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "soak",
                "--duration",
                "10",
                "--warmup",
                "10",
                "--target",
                "a=http://127.0.0.1:1/v1",
            ],
            "must be shorter than --duration",
        ),
        (
            [
                "soak",
                "--duration",
                "10",
                "--target",
                "a=http://127.0.0.1:1/v1",
                "--target",
                "b=http://127.0.0.1:1/v1",
            ],
            "one --target",
        ),
        (
            [
                "soak",
                "--duration",
                "10",
                "--target",
                "a=http://127.0.0.1:1/v1",
                "--dashboard",
                "http://10.1.2.3:8265",
            ],
            "loopback",
        ),
    ],
)
def test_bad_soak_input_is_one_error_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "a=http://127.0.0.1:1/v1"], "Missing option '--duration'"),
        (["--duration", "10", "--require", "x>1"], "No such option '--require'"),
        (["--duration", "10", "--peer", "vllm"], "No such option '--peer'"),
    ],
)
def test_soak_takes_only_its_own_options(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", "soak", *args])
    assert result.exit_code == 2 and message in result.output, result.output

"""`llm-serving bench` through the real platform: the vLLM route, the HF-baseline route and both
peers (plain vLLM's server, Ray Serve LLM deployed into the platform) in one interleaved run on the
tiny model. Checks correctness (fields, counts, files, server-side evidence
of batching, the `--require` gate), never a wall-clock threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import Platform, run_cli

LEVELS = ("c1", "c4")
TARGETS = ("vllm", "hf", "vllm-serve", "ray-serve-llm")
REQUESTS = 8
VLLM_FIELDS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "completed",
    "failed",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
)


@pytest.fixture(scope="module")
def bench_run(
    platform: Platform, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, str, Path]:
    out = tmp_path_factory.mktemp("bench")
    done = run_cli(
        "bench",
        "sweep",
        "--target",
        f"vllm={platform.url}/v1",
        "--target",
        f"hf={platform.url}/hf/v1",
        "--peer",
        "vllm",
        "--peer",
        "ray-serve-llm",
        "--config",
        str(platform.config_path),
        "--model",
        platform.model,
        "--concurrency",
        ",".join(level[1:] for level in LEVELS),
        "--requests",
        str(REQUESTS),
        "--input-len",
        "16",
        "--output-len",
        "16",
        "--stats-interval",
        "0.02",
        "--request-timeout",
        "120",
        "--output",
        str(out),
        "--require",
        "vllm.completed@c4==8",
        "--require",
        "output_throughput_ratio@c4>=1000000",
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr, out


def test_impossible_requirement_makes_the_exit_code_nonzero(
    bench_run: tuple[int, str, Path],
) -> None:
    code, output, out = bench_run
    assert code == 3, output
    assert "MISS output_throughput_ratio@c4>=1000000" in output
    checks = json.loads((out / "result.json").read_text())["requirements"]
    assert [c["passed"] for c in checks] == [True, False]


def test_every_request_completes_on_every_target(bench_run: tuple[int, str, Path]) -> None:
    _, output, out = bench_run
    doc = json.loads((out / "result.json").read_text())
    assert [level["label"] for level in doc["levels"]] == list(LEVELS)
    for level in doc["levels"]:
        assert tuple(level["results"]) == TARGETS
        for name in TARGETS:
            result = level["results"][name]
            assert all(field in result for field in VLLM_FIELDS), output
            assert (result["completed"], result["failed"]) == (REQUESTS, 0), result["failures"]
            assert result["total_output_tokens"] == REQUESTS * 16  # ignore_eos: equal work
        for other in TARGETS[1:]:
            assert level["ratios"][other]["output_throughput_ratio"] > 0


def test_the_vllm_engine_batched_at_concurrency_4(bench_run: tuple[int, str, Path]) -> None:
    _, _, out = bench_run
    doc = json.loads((out / "result.json").read_text())
    sources = doc["server_stats_sources"]
    assert (sources["vllm"], sources["hf"], sources["vllm-serve"]) == (
        "health",
        "health",
        "prometheus",
    )
    c4 = next(level for level in doc["levels"] if level["label"] == "c4")
    assert c4["results"]["vllm"]["server"]["max_running"] > 1
    assert c4["results"]["vllm"]["server"]["batching"] is True


def test_report_files_are_written(bench_run: tuple[int, str, Path]) -> None:
    _, output, out = bench_run
    for name in (
        "result.json",
        "summary.md",
        "throughput.png",
        "latency.png",
        "server.png",
        "runs/c4-vllm.json",
        "runs/c1-hf.json",
    ):
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.md").read_text()
    for other in TARGETS[1:]:
        assert f"vllm vs {other}" in output and f"vllm vs {other}" in summary


def test_peers_are_stopped_after_the_run(
    platform: Platform, bench_run: tuple[int, str, Path]
) -> None:
    from ray import serve

    from serving.local.platform import connect

    connect()
    assert "ray-serve-llm" not in serve.status().applications
    assert "vllm.entrypoints.openai.api_server" not in running_commands()


def running_commands() -> str:
    import psutil

    return "\n".join(" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))

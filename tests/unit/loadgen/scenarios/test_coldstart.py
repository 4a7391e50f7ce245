"""The coldstart bench's pure parts: loopback targets, zero replicas, "scheduled" from the two
clocks, each phase's median and spread, the report and the command's options."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from serving.loadgen.args import UsageError
from serving.loadgen.cli import bench
from serving.loadgen.client import RequestOptions, RequestResult, Target
from serving.loadgen.report import write_report
from serving.loadgen.scenarios import coldstart, coldstart_report
from serving.loadgen.scenarios.autoscale import Deployment
from serving.loadgen.scenarios.coldstart import ColdRun, ColdstartPlan


def test_only_loopback_urls_are_measured() -> None:
    assert coldstart.is_loopback_url("http://127.0.0.1:8000/v1")
    assert coldstart.is_loopback_url("http://127.0.0.2:8265")
    assert coldstart.is_loopback_url("http://[::1]:8000/v1")
    assert coldstart.is_loopback_url("http://localhost:8000/v1")
    assert not coldstart.is_loopback_url("http://10.0.0.5:8000/v1")
    assert not coldstart.is_loopback_url("http://example.com/v1")


def test_zero_means_no_replica_in_any_state() -> None:
    assert coldstart.replica_count({"replicas": []}) == 0
    assert coldstart.replica_count({}) == 0
    assert coldstart.replica_count({"replicas": [{"state": "STOPPING"}]}) == 1


def test_the_scale_up_decision_runs_from_the_request_to_serves_start() -> None:
    assert coldstart.seconds_between(1000.0, 1000.5) == 0.5
    assert coldstart.seconds_between(None, 1001.0) is None
    assert coldstart.seconds_between(1000.0, None) is None


def test_a_deployment_that_cannot_reach_zero_is_refused() -> None:
    coldstart.check_scales_to_zero(Deployment("vllm", "VLLMServer", {"min_replicas": 0}))
    with pytest.raises(UsageError, match="min_replicas 1"):
        coldstart.check_scales_to_zero(Deployment("vllm", "VLLMServer", {"min_replicas": 1}))


def test_a_failed_request_leaves_the_run_without_figures() -> None:
    run = ColdRun(1)
    coldstart.fill_from_request(run, RequestResult(status="http_503", error="busy"))
    assert (run.status, run.error, run.ttft_s) == ("http_503", "busy", None)
    done = ColdRun(2)
    coldstart.fill_from_request(done, RequestResult(success=True, ttft=20.123, latency=21.5))
    assert (done.status, done.ttft_s, done.e2e_s) == ("ok", 20.12, 21.5)


def cold_run(index: int, scale: float) -> ColdRun:
    phases = {"process_up": 1.0 * scale, "imports": 10.0 * scale, "first_request_served": 20.0}
    return ColdRun(
        index,
        ttft_s=22.0 * scale,
        e2e_s=23.0 * scale,
        scale_up_decision_s=0.25,
        phases={"scheduled": 0.5, **phases},
    )


def test_each_row_has_its_median_and_spread_over_the_runs_that_served() -> None:
    runs = [cold_run(1, 1.0), cold_run(2, 3.0), cold_run(3, 2.0), ColdRun(4, status="timeout")]
    summary = coldstart_report.summarize(runs)
    assert list(summary) == [
        "scale_up_decision",
        "scheduled",
        "process_up",
        "imports",
        "first_request_served",
        "from_zero_to_first_token",
        "from_zero_to_end",
    ]
    assert summary["imports"] == {"median": 20.0, "min": 10.0, "max": 30.0, "runs": 3}
    assert summary["scheduled"] == {"median": 0.5, "min": 0.5, "max": 0.5, "runs": 3}
    assert coldstart_report.summarize([ColdRun(1, status="never_at_zero")]) == {}


def plan() -> ColdstartPlan:
    target = Target("platform", "http://127.0.0.1:8000/v1")
    return ColdstartPlan(target, "http://127.0.0.1:8265", RequestOptions("m", "chat"), 2, 16, 600)


def test_the_report_has_the_table_and_every_run(tmp_path: Path) -> None:
    deployment = Deployment("vllm", "VLLMServer", {"min_replicas": 0})
    runs = [cold_run(1, 1.0), ColdRun(2, status="timeout", error="no answer")]
    report = coldstart_report.report(plan(), deployment, runs)
    assert not report.passed  # a run without an answer
    assert report.console[:2] == [
        "| phase | median s | min-max s | runs |",
        "| --- | ---: | ---: | ---: |",
    ]
    assert any(line.startswith("| imports | 10.00 | 10.00-10.00 | 1 |") for line in report.console)
    assert "1/2 runs from zero served" in report.console[-2]
    assert report.console[-1] == "run 2: timeout no answer"
    write_report(report, tmp_path)
    document = json.loads((tmp_path / "result.json").read_text())
    assert document["scenario"] == "coldstart"
    assert [run["status"] for run in document["runs"]] == ["ok", "timeout"]
    assert "| from_zero_to_first_token" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--runs", "0"], "--runs"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--duration", "0"], "--duration"),
    ],
)
def test_out_of_range_options_are_usage_errors(given: list[str], message: str) -> None:
    result = CliRunner().invoke(bench, ["coldstart", *given])
    assert result.exit_code == 2 and message in result.output


def test_a_target_off_this_machine_is_refused_before_anything_is_sent() -> None:
    given = ["--target", "x=http://10.1.2.3:8000/v1", "--dashboard", "http://127.0.0.1:8265"]
    result = CliRunner().invoke(bench, ["coldstart", *given, "--model", "m"])
    assert result.exit_code == 2
    assert "loopback targets only" in result.output


def test_the_options_reach_the_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[coldstart.ColdstartArgs] = []

    def run_bench(args: coldstart.ColdstartArgs) -> None:
        seen.append(args)
        raise UsageError("stopped here")

    monkeypatch.setattr(coldstart, "run_bench", run_bench)
    argv = ["coldstart", "--runs", "5", "--max-tokens", "8", "--model", "tiny", "--duration", "90"]
    result = CliRunner().invoke(bench, argv)
    assert result.exit_code == 2 and "error: stopped here" in result.output
    assert seen and (seen[0].runs, seen[0].max_tokens, seen[0].model, seen[0].duration) == (
        5,
        8,
        "tiny",
        90.0,
    )


def dashboard(answers: list[list[dict]], min_replicas: int = 0) -> httpx.AsyncClient:
    """A dashboard whose Serve API lists these replicas, one answer per read (the last repeats)."""

    def handle(request: httpx.Request) -> httpx.Response:
        replicas = answers.pop(0) if len(answers) > 1 else answers[0]
        config = {"autoscaling_config": {"min_replicas": min_replicas}}
        deployment = {"replicas": replicas, "deployment_config": config}
        app = {"route_prefix": "/", "deployments": {"VLLMServer": deployment}}
        return httpx.Response(200, json={"applications": {"vllm": app}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def test_the_wait_ends_when_serve_lists_no_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coldstart, "POLL_S", 0.0)
    answers = [[{"state": "RUNNING"}], [{"state": "STOPPING"}], []]

    async def wait() -> tuple[Deployment, bool, list]:
        async with dashboard(answers) as http:
            found = await coldstart.locate(http, plan())
            return (
                found,
                await coldstart.wait_for_zero(http, plan(), time.monotonic() + 60),
                answers,
            )

    found, at_zero, left = asyncio.run(wait())
    assert (found.application, found.name, at_zero) == ("vllm", "VLLMServer", True)
    assert left == [[]]  # it read until the list was empty


def test_a_deployment_that_keeps_a_replica_is_refused_before_any_run() -> None:
    async def locate() -> Deployment:
        async with dashboard([[]], min_replicas=1) as http:
            return await coldstart.locate(http, plan())

    with pytest.raises(UsageError, match="needs min_replicas 0"):
        asyncio.run(locate())


@pytest.mark.parametrize(
    ("name", "engine_core", "standby_s", "kv_gb"),
    [
        ("bench-coldstart-before.yaml", "process", 0, None),
        ("bench-coldstart.yaml", "process", 86400, None),
        ("bench-coldstart-inprocess.yaml", "inprocess", 86400, 1.0),
    ],
)
def test_the_benchs_configs_scale_to_zero(
    name: str, engine_core: str, standby_s: int, kv_gb: float | None
) -> None:
    from serving.config import load_config

    config = load_config(Path(coldstart.__file__).parents[2] / name)
    assert config.vllm.autoscaling is not None and config.vllm.autoscaling.min_replicas == 0
    engine = config.vllm.engine
    assert (engine.engine_core, engine.standby_worker_s, engine.kv_cache_memory_gb) == (
        engine_core,
        standby_s,
        kv_gb,
    )

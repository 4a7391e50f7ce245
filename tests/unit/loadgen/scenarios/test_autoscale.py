"""The autoscale scenario's pure parts: the dashboard's answer, the timeline maths, request
counting, the report; and the PromQL metric-name parser the dashboard test relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.loadgen.client import RequestOptions, RequestResult, Target, TargetError
from serving.loadgen.report import write_report
from serving.loadgen.scenarios import autoscale, autoscale_report, autoscale_timeline
from serving.loadgen.scenarios.autoscale_timeline import ReplicaSample, figures
from tests.promql import dashboard_metric_names, promql_metric_names

ROOT = Path(__file__).resolve().parents[4]


def deployment(states: list[str], target: int, autoscaling: dict | None = None) -> dict:
    return {
        "replicas": [{"state": s} for s in states],
        "target_num_replicas": target,
        "deployment_config": {"autoscaling_config": autoscaling},
    }


def applications() -> dict:
    return {
        "applications": {
            "vllm": {
                "route_prefix": "/",
                "deployments": {"VLLMServer": deployment(["RUNNING"], 1, {"max_replicas": 2})},
            },
            "autoscale": {
                "route_prefix": "/autoscale",
                "deployments": {"VLLMServer": deployment(["RUNNING"], 1, {"max_replicas": 4})},
            },
            "analysis": {
                "route_prefix": "/analysis",
                "deployments": {"Analysis": deployment(["RUNNING"], 1)},
            },
        }
    }


def test_the_longest_route_prefix_picks_the_application() -> None:
    assert autoscale.find_deployment(applications(), "/autoscale/v1").application == "autoscale"
    found = autoscale.find_deployment(applications(), "/v1")
    assert (found.application, found.name, found.autoscaling_config) == (
        "vllm",
        "VLLMServer",
        {"max_replicas": 2},
    )
    assert autoscale.find_deployment(applications(), "/autoscalex/v1").application == "vllm"


def test_a_model_behind_the_models_endpoint_picks_its_own_application() -> None:
    body = applications()
    body["applications"]["vllm-b"] = {
        "route_prefix": None,
        "deployments": {
            "ModelEntry": deployment(["RUNNING"], 1),
            "VLLMServer": deployment(["RUNNING"], 1, {"max_replicas": 3}),
        },
    }
    found = autoscale.find_deployment(body, "/v1", model="b")
    assert (found.application, found.name) == ("vllm-b", "VLLMServer")
    assert autoscale.find_deployment(body, "/v1", model="other").application == "vllm"
    names = {(d.application, d.name) for d in autoscale.autoscaling_deployments(body)}
    assert names == {("vllm", "VLLMServer"), ("autoscale", "VLLMServer"), ("vllm-b", "VLLMServer")}


def test_the_report_shows_what_the_other_deployments_did() -> None:
    run = autoscale.Run(autoscale.Deployment("vllm-a", "VLLMServer", {}))
    run.others["vllm-b/VLLMServer"] = [ReplicaSample(0, 1, 0, 0, 1), ReplicaSample(1, 1, 0, 0, 1)]
    others = autoscale_report.other_deployments(run)
    assert others == {"vllm-b/VLLMServer": {"min_running": 1, "max_running": 1, "max_target": 1}}
    assert "vllm-b/VLLMServer ran 1-1 replicas" in autoscale_report.others_text(
        {"other_deployments": others}
    )


def test_an_application_without_autoscaling_is_an_error() -> None:
    with pytest.raises(TargetError, match="no autoscaling deployment"):
        autoscale.find_deployment(applications(), "/analysis/x")
    with pytest.raises(TargetError, match="no Serve application"):
        autoscale.find_deployment({"applications": {}}, "/v1")


def test_replica_sample_counts_states_and_keeps_the_target() -> None:
    sample = autoscale_timeline.replica_sample(
        1.5, deployment(["RUNNING", "STARTING", "STOPPING", "RECOVERING"], 3)
    )
    assert sample == ReplicaSample(1.5, running=1, starting=2, stopping=1, target=3)


def timeline() -> list[ReplicaSample]:
    # (t, running, starting, stopping, target): up decided at 3, serving at 40, load ends at 50,
    # target back to 1 at 58, the old replica gone at 61.
    rows = [
        (0, 1, 0, 0, 1),
        (2, 1, 0, 0, 1),
        (3, 1, 0, 0, 2),
        (4, 1, 1, 0, 2),
        (40, 2, 0, 0, 2),
        (52, 2, 0, 0, 2),
        (58, 1, 0, 1, 1),
        (61, 1, 0, 0, 1),
    ]
    return [ReplicaSample(*row) for row in rows]


def test_figures_time_scale_up_from_the_burst_and_scale_down_from_the_load_end() -> None:
    assert figures(timeline(), load_end=50.0) == {
        "scale_up_decision_s": 3.0,
        "second_replica_serving_s": 40.0,
        "load_duration_s": 50.0,
        "scale_down_decision_s": 8.0,
        "back_to_one_s": 11.0,
    }


def test_a_replica_starting_counts_as_the_decision_even_before_the_target_shows() -> None:
    samples = [ReplicaSample(0, 1, 0, 0, 1), ReplicaSample(5, 1, 1, 0, 1)]
    assert autoscale_timeline.scale_up_decided_at(samples) == 5


def test_no_scale_up_means_no_scale_down_figures() -> None:
    samples = [ReplicaSample(t, 1, 0, 0, 1) for t in range(10)]
    assert figures(samples, load_end=5.0) == {
        "scale_up_decision_s": None,
        "second_replica_serving_s": None,
        "load_duration_s": 5.0,
        "scale_down_decision_s": None,
        "back_to_one_s": None,
    }


def test_a_stuck_scale_down_shows_which_side_is_stuck() -> None:
    target_stuck = [*timeline()[:6], ReplicaSample(90, 2, 0, 0, 2)]
    assert figures(target_stuck, 50.0)["scale_down_decision_s"] is None
    replica_stuck = [*timeline()[:6], ReplicaSample(58, 1, 0, 1, 1), ReplicaSample(90, 1, 0, 1, 1)]
    fig = figures(replica_stuck, 50.0)
    assert (fig["scale_down_decision_s"], fig["back_to_one_s"]) == (8.0, None)


def test_scale_down_counts_only_after_the_second_replica_served() -> None:
    # The load ended (t=2) before the second replica came up (t=40): scale-down counts from 40.
    fig = figures(timeline(), load_end=2.0)
    assert fig["scale_down_decision_s"] == 56.0 and fig["back_to_one_s"] == 59.0


def test_requests_are_completed_refused_with_retry_after_or_failed() -> None:
    results = [
        RequestResult(success=True),
        RequestResult(status="http_503", retry_after="1"),
        RequestResult(status="http_503"),
        RequestResult(status="timeout"),
    ]
    assert autoscale.request_counts(results) == {
        "sent": 4,
        "completed": 1,
        "refused_with_retry_after": 1,
        "failed": 2,
        "failures": {"http_503": 1, "timeout": 1},
    }


def test_retry_wait_is_bounded() -> None:
    assert autoscale.retry_wait(RequestResult(retry_after="2")) == 2.0
    assert autoscale.retry_wait(RequestResult(retry_after="600")) == autoscale.MAX_RETRY_WAIT_S
    assert (
        autoscale.retry_wait(RequestResult(retry_after="Wed, 21 Oct 2015"))
        == autoscale.MAX_RETRY_WAIT_S
    )


def test_markers_place_scale_down_events_after_the_load_end() -> None:
    markers = autoscale_report.timeline_markers(figures(timeline(), load_end=50.0))
    assert markers == [
        (3.0, "scale-up decided"),
        (40.0, "2nd replica serving"),
        (50.0, "load ended"),
        (61.0, "one replica"),
    ]


def test_report_files_hold_the_figures_and_the_timeline(tmp_path: Path) -> None:
    plan = autoscale.AutoscalePlan(
        target=Target("t", "http://127.0.0.1:1/autoscale/v1"),
        dashboard_url="http://127.0.0.1:2",
        queue_source=None,
        opts=RequestOptions("m"),
        specs=[],
        concurrency=4,
    )
    run = autoscale.Run(
        autoscale.Deployment("autoscale", "VLLMServer", {"max_replicas": 2}),
        results=[RequestResult(success=True)],
        replicas=timeline(),
        queue=[autoscale.QueueSample(0.0, 4, 2, 2)],
        load_end=50.0,
    )
    write_report(autoscale_report.report(plan, run), tmp_path)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["figures"]["second_replica_serving_s"] == 40.0
    assert saved["timeline"]["replicas"][2] == [3, 1, 0, 0, 2]
    assert (
        "| burst start -> second replica RUNNING | 40.0 s |"
        in (tmp_path / "summary.md").read_text()
    )
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_promql_names_leave_out_functions_labels_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, engine) (rate(ttft_bucket{engine=~"$e", x="a(b)"}[1m])))'
        " / on(engine) group_left sum(up_total offset 5m) and 2e3"
    )
    assert promql_metric_names(expr) == {"ttft_bucket", "up_total"}
    assert promql_metric_names("count(foo:recorded)") == {"foo:recorded"}


def test_the_grafana_dashboard_queries_the_platform_metrics() -> None:
    dashboard = json.loads((ROOT / "helm/llm-serving/dashboards/llm-serving.json").read_text())
    names = dashboard_metric_names(dashboard)
    assert "ray_llm_serving_queue_depth" in names
    assert "ray_llm_serving_time_to_first_token_seconds_bucket" in names
    assert not any(name in {"rate", "sum", "le", "engine"} for name in names)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dashboard", "nope"], "error: --dashboard 'nope': expected http://HOST:PORT"),
        (["--target", "b=http://127.0.0.1:9/v1"], "error: bench autoscale loads one --target"),
    ],
)
def test_bad_autoscale_input_is_one_error_line(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from serving.cli import main

    result = CliRunner().invoke(
        main, ["bench", "autoscale", "--target", "a=http://127.0.0.1:9/v1", *args]
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in result.output


def test_a_replicas_start_up_lists_the_named_phases_first() -> None:
    startup = {"import_vllm": 7.0, "imports": 9.0, "process_up": 1.0, "first_request_served": 30.0}
    assert autoscale_report.startup_text(startup) == (
        "process_up 1.0 s, imports 9.0 s, first_request_served 30.0 s; details: import_vllm 7.0 s"
    )
    assert autoscale_report.startup_text({"import_vllm": 7.0}) == "details: import_vllm 7.0 s"


def test_each_replica_reached_is_reported_once_counted_from_serves_start() -> None:
    import asyncio

    import httpx

    healths = [
        {"startup_s": {"import_vllm": 1.0}, "startup_at": {"process_created": t, "replica_init": i}}
        for t, i in ((100.0, 105.0), (150.0, 205.0))  # the second: a worker Ray started early
    ]
    reads = iter(healths * 4)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/health"):
            return httpx.Response(200, json=next(reads))
        replicas = [{"start_time_s": 99.0}, {"start_time_s": 200.0}, {"start_time_s": 0}]
        apps = {"autoscale": {"deployments": {"VLLMServer": {"replicas": replicas}}}}
        return httpx.Response(200, json={"applications": apps})

    plan = autoscale.AutoscalePlan(
        target=Target("t", "http://127.0.0.1:1/autoscale/v1"),
        dashboard_url="http://127.0.0.1:2",
        queue_source=None,
        opts=RequestOptions("m"),
        specs=[],
        concurrency=4,
    )
    run = autoscale.Run(autoscale.Deployment("autoscale", "VLLMServer", {"max_replicas": 2}))

    async def read() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
            await autoscale.read_startup(http, plan, run)

    asyncio.run(read())
    assert [(s["scheduled"], s["process_up"]) for s in run.startup_s] == [(1.0, 5.0), (0.0, 5.0)]
    assert all(s["import_vllm"] == 1.0 for s in run.startup_s)

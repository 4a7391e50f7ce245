"""The autoscale run end to end against a loopback server (no Ray, no model): a fake engine
behind the real OpenAI routes and a fake Ray dashboard whose replicas follow the load, scripted
like Serve (target 2 when requests arrive, a second replica RUNNING shortly after, back to one
once the load is gone). Some requests are refused with 503 + Retry-After, as Serve's proxy does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from serving.api.routes import build_openai_app
from serving.loadgen.client import RequestOptions, Target
from serving.loadgen.scenarios import autoscale, autoscale_timeline
from serving.loadgen.server_stats import HealthSource
from serving.loadgen.workloads import RequestSpec
from tests.unit.fake_engine import FakeEngine
from tests.unit.loopback import serve_on_loopback

UP_AFTER_S, DOWN_AFTER_S = 0.6, 0.6


class ScriptedServe:
    """Replica states as a function of the load the app saw."""

    def __init__(self) -> None:
        self.first_request: float | None = None
        self.last_done = 0.0
        self.in_flight = self.seen = 0

    def deployment(self) -> dict:
        now = time.monotonic()
        loaded = self.in_flight > 0 or now - self.last_done < DOWN_AFTER_S
        up = self.first_request is not None and loaded
        serving = up and now - self.first_request >= UP_AFTER_S
        states = ["RUNNING", "RUNNING" if serving else "STARTING"] if up else ["RUNNING"]
        return {
            "replicas": [{"state": s} for s in states],
            "target_num_replicas": 2 if up else 1,
            "deployment_config": {"autoscaling_config": {"max_replicas": 2}},
        }


@pytest.fixture
def server() -> Iterator[tuple[str, ScriptedServe]]:
    serve = ScriptedServe()
    app = FastAPI()

    @app.get("/api/serve/applications/")
    def applications() -> dict:
        return {
            "applications": {
                "scaled": {"route_prefix": "/scaled", "deployments": {"Fake": serve.deployment()}}
            }
        }

    @app.middleware("http")
    async def count(request: Request, call_next):
        if not request.url.path.endswith("/completions"):
            return await call_next(request)
        serve.seen += 1
        serve.first_request = serve.first_request or time.monotonic()
        if serve.seen % 5 == 0:  # Serve's backpressure answer
            return PlainTextResponse("busy", status_code=503, headers={"Retry-After": "0"})
        serve.in_flight += 1
        try:
            return await call_next(request)
        finally:
            serve.in_flight -= 1
            serve.last_done = time.monotonic()

    app.mount("/scaled", build_openai_app(FakeEngine(delay_s=0.01)))
    with serve_on_loopback(app) as url:
        yield url, serve


def test_a_step_burst_records_scale_up_and_scale_down(server: tuple[str, ScriptedServe]) -> None:
    url, serve = server
    target = Target("scaled", f"{url}/scaled/v1")
    plan = autoscale.AutoscalePlan(
        target=target,
        dashboard_url=url,
        queue_source=HealthSource(f"{target.origin}/health"),
        opts=RequestOptions("fake-model"),
        specs=[RequestSpec("alpha beta", 2, 16)] * 5000,
        concurrency=4,
        max_load_s=20,
        hold_s=0.5,
        scale_down_timeout_s=20,
        queue_interval_s=0.1,
    )
    run = asyncio.run(autoscale.run_autoscale(plan))
    fig = autoscale_timeline.figures(run.replicas, run.load_end)
    assert run.deployment.application == "scaled"
    assert fig["scale_up_decision_s"] is not None and fig["second_replica_serving_s"] is not None
    assert fig["scale_up_decision_s"] <= fig["second_replica_serving_s"] < fig["load_duration_s"]
    assert fig["back_to_one_s"] is not None
    counts = autoscale.request_counts(run.results)
    assert counts["failed"] == 0, counts
    assert counts["refused_with_retry_after"] > 0 and counts["completed"] > 0
    assert counts["sent"] == serve.seen < 5000  # stopped once scaled, not when the specs ran out
    assert max(s.in_flight for s in run.queue) == 4

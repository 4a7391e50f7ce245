"""`llm-serving bench autoscale`: a bounded step burst against one autoscaling
deployment while its replicas (the Ray dashboard's REST API, so it works from outside the
cluster) and its queue are sampled; reports how long scale-up and scale-down took and what
happened to every request. The timeline maths are pure functions over the samples
(autoscale_timeline.py)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx
import openai

from serving import metrics as platform_metrics
from serving.loadgen.args import StepArgs, UsageError, build_requests, check_targets, one_target
from serving.loadgen.client import (
    RequestOptions,
    RequestResult,
    Target,
    TargetError,
    make_client,
    send_request,
)
from serving.loadgen.replica_startup import replica_phases, serve_start_before
from serving.loadgen.scenarios.autoscale_timeline import (
    ReplicaSample,
    figures,
    replica_sample,
    second_replica_serving_at,
)
from serving.loadgen.server_stats import HealthSource, PrometheusSource, StatsSource
from serving.loadgen.workloads import RequestSpec
from serving.local.ray_access import ray_auth_headers

REPLICA_POLL_S = 1.0
HOLD_AFTER_SCALE_UP_S = 10.0  # keep the step on so the new replica serves part of it
MAX_LOAD_S = 600.0  # the step's cap when --duration is not given
SCALE_DOWN_TIMEOUT_S = 300.0
MAX_RETRY_WAIT_S = 5.0
MAX_SAMPLES = 20_000
LOCATE_TRIES = 30  # seconds of dashboard 5xx tolerated before giving up
STARTUP_PROBES = 8  # /health reads after scale-up: the router spreads them over the replicas


@dataclass(frozen=True)
class QueueSample:
    t: float
    in_flight: int  # requests the load generator has sent and not yet seen answered
    running: int  # in the engine's batch (platform metrics)
    waiting: int  # in the engine's queue


@dataclass(frozen=True)
class Deployment:
    application: str
    name: str
    autoscaling_config: dict[str, Any]


@dataclass(frozen=True)
class AutoscalePlan:
    target: Target
    dashboard_url: str
    queue_source: StatsSource | None
    opts: RequestOptions
    specs: list[RequestSpec]  # the step sends at most these
    concurrency: int
    max_load_s: float = MAX_LOAD_S
    hold_s: float = HOLD_AFTER_SCALE_UP_S
    scale_down_timeout_s: float = SCALE_DOWN_TIMEOUT_S
    queue_interval_s: float = 2.0


@dataclass
class Run:
    """What one autoscale run observed; times are seconds since the burst started."""

    deployment: Deployment
    # Every other autoscaling deployment (other models): its replica samples, to show the burst
    # scaled the target's deployment alone.
    others: dict[str, list[ReplicaSample]] = field(default_factory=dict)
    results: list[RequestResult] = field(default_factory=list)
    replicas: list[ReplicaSample] = field(default_factory=list)
    queue: list[QueueSample] = field(default_factory=list)
    poll_errors: Counter = field(default_factory=Counter)
    startup_s: list[dict[str, float]] = field(default_factory=list)
    load_end: float | None = None
    in_flight: int = 0


# -- pure: the dashboard's answer and the timeline maths -------------------------------------------


def path_under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return not prefix or path == prefix or path.startswith(prefix + "/")


def autoscaling_deployments(body: dict[str, Any]) -> list[Deployment]:
    """Every autoscaling deployment of every Serve application."""
    found = []
    for app_name, app in (body.get("applications") or {}).items():
        for name, details in (app.get("deployments") or {}).items():
            config = (details.get("deployment_config") or {}).get("autoscaling_config")
            if config:
                found.append(Deployment(app_name, name, config))
    return found


def find_deployment(body: dict[str, Any], target_path: str, model: str | None = None) -> Deployment:
    """The autoscaling deployment serving the request: the model's own application when the
    endpoint serves several models (`vllm-MODEL`), else the application whose route prefix serves
    the target's path (the longest prefix wins, as in Serve's proxy)."""
    apps = body.get("applications") or {}
    app_name = f"vllm-{model}" if model else ""
    if app_name not in apps:
        routed = [
            (len(app["route_prefix"]), name)
            for name, app in apps.items()
            if app.get("route_prefix") and path_under(target_path, app["route_prefix"])
        ]
        if not routed:
            raise TargetError(f"no Serve application routes {target_path!r} (apps: {sorted(apps)})")
        app_name = max(routed)[1]
    for found in autoscaling_deployments(body):
        if found.application == app_name:
            return found
    raise TargetError(f"Serve application {app_name!r} has no autoscaling deployment")


def is_refusal(result: RequestResult) -> bool:
    """Backpressure's answer: 503 (or 429) with Retry-After; not a lost request."""
    return result.status in ("http_503", "http_429") and bool(result.retry_after)


def request_counts(results: list[RequestResult]) -> dict[str, Any]:
    failures = Counter(r.status for r in results if not r.success and not is_refusal(r))
    return {
        "sent": len(results),
        "completed": sum(r.success for r in results),
        "refused_with_retry_after": sum(is_refusal(r) for r in results),
        "failed": sum(failures.values()),
        "failures": dict(failures),
    }


def retry_wait(result: RequestResult) -> float:
    try:
        return min(max(float(result.retry_after), 0.0), MAX_RETRY_WAIT_S)
    except ValueError:
        return MAX_RETRY_WAIT_S


# -- the run -----------------------------------------------------------------------------------


def default_queue_source(metrics_url: str | None, target: Target) -> StatsSource:
    """The platform's own gauges summed over replicas; without a metrics URL the target's
    /health (one replica's numbers per read)."""
    if metrics_url:
        return PrometheusSource(
            metrics_url, f"ray_{platform_metrics.RUNNING}", f"ray_{platform_metrics.QUEUE_DEPTH}"
        )
    return HealthSource(f"{target.origin}/health")


async def read_applications(http: httpx.AsyncClient, dashboard_url: str) -> dict[str, Any]:
    response = await http.get(
        f"{dashboard_url.rstrip('/')}/api/serve/applications/", headers=ray_auth_headers()
    )
    response.raise_for_status()
    return response.json()


async def locate(
    http: httpx.AsyncClient, plan: AutoscalePlan, tries: int = LOCATE_TRIES
) -> Deployment:
    """The target's deployment; the dashboard's Serve API answers 5xx for a while after a deploy."""
    path = urlparse(plan.target.base_url).path
    model = plan.target.model or plan.opts.model
    for _ in range(tries - 1):
        with contextlib.suppress(httpx.HTTPError, ValueError, TargetError):
            return find_deployment(await read_applications(http, plan.dashboard_url), path, model)
        await asyncio.sleep(1.0)
    try:
        return find_deployment(await read_applications(http, plan.dashboard_url), path, model)
    except (httpx.HTTPError, ValueError) as err:
        raise TargetError(
            f"Ray dashboard {plan.dashboard_url}: {describe_http_error(err)}"
        ) from None


def describe_http_error(err: Exception) -> str:
    if isinstance(err, httpx.HTTPStatusError):
        return f"GET /api/serve/applications/ answered HTTP {err.response.status_code}"
    return f"no Serve applications ({type(err).__name__})"


async def poll_replicas(http: httpx.AsyncClient, plan: AutoscalePlan, run: Run, t0: float) -> None:
    dep = run.deployment
    while len(run.replicas) < MAX_SAMPLES:
        try:
            body = await read_applications(http, plan.dashboard_url)
            t = time.perf_counter() - t0
            for found in autoscaling_deployments(body):
                details = body["applications"][found.application]["deployments"][found.name]
                sample = replica_sample(t, details)
                if found == dep:
                    run.replicas.append(sample)
                else:
                    run.others.setdefault(f"{found.application}/{found.name}", []).append(sample)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            run.poll_errors["dashboard"] += 1
        await asyncio.sleep(REPLICA_POLL_S)


async def poll_queue(http: httpx.AsyncClient, plan: AutoscalePlan, run: Run, t0: float) -> None:
    last = (0, 0)
    while plan.queue_source is not None and len(run.queue) < MAX_SAMPLES:
        try:
            last = await plan.queue_source.read(http) or last  # a silent read keeps the last value
        except (httpx.HTTPError, ValueError):
            run.poll_errors["queue"] += 1
        run.queue.append(QueueSample(time.perf_counter() - t0, run.in_flight, *last))
        await asyncio.sleep(plan.queue_interval_s)


async def step_load(
    client: openai.AsyncOpenAI, plan: AutoscalePlan, run: Run, stop: asyncio.Event
) -> None:
    """`concurrency` requests in flight (closed loop) until `stop`, bounded by the specs."""
    pending = iter(plan.specs)  # shared by the workers: every spec is sent at most once

    async def worker() -> None:
        for spec in pending:
            if stop.is_set():
                return
            run.in_flight += 1
            result = await send_request(client, plan.opts, spec)
            run.in_flight -= 1
            run.results.append(result)
            if is_refusal(result):  # a polite client waits as told before the next request
                await asyncio.sleep(retry_wait(result))

    await asyncio.gather(*(worker() for _ in range(plan.concurrency)))


async def stop_when_scaled(plan: AutoscalePlan, run: Run, stop: asyncio.Event, t0: float) -> None:
    """End the step once the second replica has served for `hold_s`, or at `max_load_s`."""
    while not stop.is_set():
        now = time.perf_counter() - t0
        up = second_replica_serving_at(run.replicas)
        if now >= plan.max_load_s or (up is not None and now - up >= plan.hold_s):
            stop.set()
        await asyncio.sleep(REPLICA_POLL_S)


async def read_startup(http: httpx.AsyncClient, plan: AutoscalePlan, run: Run) -> None:
    """Start-up phases of the replicas /health reached (one each), counted from Serve's start of
    each replica where the dashboard gives it."""
    seen: dict[Any, dict[str, Any]] = {}
    for _ in range(STARTUP_PROBES):
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            health = (await http.get(f"{plan.target.origin}/health")).json()
            if health.get("startup_s"):
                key = (health.get("startup_at") or {}).get("process_created") or str(health)
                seen.setdefault(key, health)
    starts: list[float] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        body = await read_applications(http, plan.dashboard_url)
        dep = run.deployment
        replicas = body["applications"][dep.application]["deployments"][dep.name]["replicas"]
        starts = [float(r["start_time_s"]) for r in replicas if r.get("start_time_s")]
    run.startup_s = [
        replica_phases(health, serve_start_before(starts, health)) for health in seen.values()
    ]


async def wait_for_one_replica(plan: AutoscalePlan, run: Run) -> None:
    deadline = time.perf_counter() + plan.scale_down_timeout_s
    while time.perf_counter() < deadline:
        if second_replica_serving_at(run.replicas) is None:
            return  # never scaled up: nothing to wait for
        if figures(run.replicas, run.load_end)["back_to_one_s"] is not None:
            return
        await asyncio.sleep(REPLICA_POLL_S)


async def run_autoscale(plan: AutoscalePlan) -> Run:
    async with httpx.AsyncClient(timeout=10) as http:
        run = Run(await locate(http, plan))
        client = make_client(plan.target, plan.opts)
        stop = asyncio.Event()
        t0 = time.perf_counter()
        pollers = [
            asyncio.create_task(poll_replicas(http, plan, run, t0)),
            asyncio.create_task(poll_queue(http, plan, run, t0)),
        ]
        watcher = asyncio.create_task(stop_when_scaled(plan, run, stop, t0))
        try:
            await step_load(client, plan, run, stop)
            run.load_end = time.perf_counter() - t0
            stop.set()
            await watcher
            if second_replica_serving_at(run.replicas) is not None:
                await read_startup(http, plan, run)
            await wait_for_one_replica(plan, run)
        finally:
            for task in (*pollers, watcher):
                task.cancel()
            await asyncio.gather(*pollers, watcher, return_exceptions=True)
            await client.close()
    return run


# -- the command ---------------------------------------------------------------------------------


def local_endpoints() -> tuple[str | None, str | None]:
    """(dashboard, metrics) URLs of the platform `llm-serving up` started here, if any."""
    from serving.local.platform import load_state

    state = load_state()
    return (state.dashboard_url, state.metrics_url) if state else (None, None)


@dataclass(frozen=True)
class AutoscaleArgs(StepArgs):
    """`bench autoscale`: --concurrency is the step's height, --duration caps it."""

    stats_interval: float


def build_plan(args: AutoscaleArgs) -> AutoscalePlan:
    """One target; --requests bounds the step, --duration caps it (default MAX_LOAD_S)."""
    target = one_target(args, "autoscale")
    local_dashboard, local_metrics = local_endpoints()
    dashboard = args.dashboard
    if dashboard is not None and not dashboard.startswith(("http://", "https://")):
        raise UsageError(f"--dashboard {dashboard!r}: expected http://HOST:PORT")
    dashboard = (dashboard or local_dashboard or "").rstrip("/")
    if not dashboard:
        raise UsageError("no --dashboard given and no local platform is running")
    # The local metrics endpoint only describes the cluster whose dashboard this is.
    metrics_url = local_metrics if dashboard == (local_dashboard or "").rstrip("/") else None
    model = asyncio.run(check_targets([target], args.model))
    opts = RequestOptions(
        model, args.endpoint, not args.free_length, timeout_s=args.request_timeout
    )
    return AutoscalePlan(
        target=target,
        dashboard_url=dashboard,
        queue_source=default_queue_source(metrics_url, target),
        opts=opts,
        specs=build_requests(args),
        concurrency=args.concurrency,
        max_load_s=args.duration if math.isfinite(args.duration) else MAX_LOAD_S,
        # Ray exports metrics every 2 s: reading faster only costs the CPU the new replica needs
        queue_interval_s=max(args.stats_interval, 2.0),
    )


def run_step(args: AutoscaleArgs) -> tuple[AutoscalePlan, Run]:
    """The whole scenario; its report is autoscale_report's (the CLI joins them)."""
    import click

    plan = build_plan(args)
    click.echo(
        f"autoscale: step of {plan.concurrency} in flight against {plan.target.base_url}; "
        f"replicas from {plan.dashboard_url}",
        err=True,
    )
    return plan, asyncio.run(run_autoscale(plan))

"""`llm-serving bench coldstart`: start one `min_replicas: 0` deployment from zero N times. Each
run waits until Serve reports no replica of it (the Ray dashboard's REST API: no request reaches
the deployment meanwhile), sends one streaming chat request, times it to the first token and to
the end, and reads the new replica's start-up moments from its /health. What happens before the
replica's process exists only the outside sees: when Serve's controller started the replica (the
dashboard's `start_time_s`) splits the time before the process into "scale_up_decision" (request
sent at zero -> Serve starts the replica) and "scheduled" (-> its process exists; 0 for a worker
Ray started beforehand). Loopback targets only, so every clock is this machine's."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

from serving.loadgen.args import UsageError, targets_of
from serving.loadgen.client import (
    RequestOptions,
    RequestResult,
    Target,
    TargetError,
    make_client,
    send_request,
    served_models,
)
from serving.loadgen.replica_startup import replica_phases, serve_start_time
from serving.loadgen.scenarios.autoscale import Deployment, find_deployment, read_applications
from serving.loadgen.workloads import RequestSpec

POLL_S = 1.0
LOCATE_TRIES = 30
PROMPT = "Say hello in one short sentence."


@dataclass(frozen=True)
class ColdstartArgs:
    """The options of `bench coldstart`."""

    target_items: tuple[str, ...]
    dashboard: str | None
    model: str | None
    runs: int
    max_tokens: int
    request_timeout: float
    duration: float  # the whole bench's bound in seconds


@dataclass
class ColdRun:
    """One start from zero; seconds, None where it was not reached."""

    index: int
    status: str = "ok"  # ok, or why the run has no figures (the request's failure kind, ...)
    waited_for_zero_s: float = 0.0
    ttft_s: float | None = None  # request sent at zero -> first token
    e2e_s: float | None = None  # request sent at zero -> last token
    scale_up_decision_s: float | None = None  # request sent -> Serve started the replica
    # The replica's /health startup_s, its named phases counted from Serve's start (scheduled
    # included) where the dashboard gave it.
    phases: dict[str, float] = field(default_factory=dict)
    replica: str = ""
    error: str = ""


@dataclass(frozen=True)
class ColdstartPlan:
    target: Target
    dashboard_url: str
    opts: RequestOptions
    runs: int
    max_tokens: int
    budget_s: float


# -- pure -------------------------------------------------------------------------------------------


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def replica_count(deployment: dict[str, Any]) -> int:
    """Replicas of a deployment in any state (a STOPPING one still holds its process)."""
    return len(deployment.get("replicas") or [])


def seconds_between(start: float | None, end: Any) -> float | None:
    return None if start is None or end is None else round(float(end) - start, 2)


def check_scales_to_zero(deployment: Deployment) -> None:
    minimum = deployment.autoscaling_config.get("min_replicas")
    if minimum != 0:
        raise UsageError(
            f"deployment {deployment.application}/{deployment.name} has min_replicas "
            f"{minimum}: bench coldstart needs min_replicas 0 (serving/bench-coldstart.yaml)"
        )


# -- the run ---------------------------------------------------------------------------------------


async def deployment_details(http: httpx.AsyncClient, plan: ColdstartPlan) -> dict[str, Any]:
    body = await read_applications(http, plan.dashboard_url)
    found = find_deployment(body, urlparse(plan.target.base_url).path, plan.opts.model)
    return body["applications"][found.application]["deployments"][found.name]


async def locate(http: httpx.AsyncClient, plan: ColdstartPlan) -> Deployment:
    """The target's deployment (the dashboard's Serve API answers 5xx for a while after a
    deploy), checked to scale to zero."""
    found = None
    for _ in range(LOCATE_TRIES):
        with contextlib.suppress(httpx.HTTPError, ValueError, TargetError):
            body = await read_applications(http, plan.dashboard_url)
            found = find_deployment(body, urlparse(plan.target.base_url).path, plan.opts.model)
            break
        await asyncio.sleep(POLL_S)
    if found is None:
        raise TargetError(f"Ray dashboard {plan.dashboard_url}: no Serve application serves it")
    check_scales_to_zero(found)  # a UsageError (a ValueError): outside the retries
    return found


async def wait_for_zero(http: httpx.AsyncClient, plan: ColdstartPlan, deadline: float) -> bool:
    """Until Serve lists no replica of the deployment (False at the deadline)."""
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if replica_count(await deployment_details(http, plan)) == 0:
                return True
        await asyncio.sleep(POLL_S)
    return False


async def read_health(http: httpx.AsyncClient, target: Target) -> dict[str, Any]:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = await http.get(f"{target.origin}/health")
        if response.status_code == 200:
            return response.json()
    return {}


def fill_from_request(run: ColdRun, result: RequestResult) -> None:
    run.replica = result.replica
    if not result.success:
        run.status, run.error = result.status, result.error
        return
    run.ttft_s, run.e2e_s = round(result.ttft, 2), round(result.latency, 2)


async def timed_request(plan: ColdstartPlan, deadline: float) -> tuple[float, RequestResult]:
    """(when it was sent, epoch seconds; the streamed request's result), within the deadline."""
    timeout_s = max(1.0, min(plan.opts.timeout_s, deadline - time.monotonic()))
    opts = RequestOptions(plan.opts.model, "chat", timeout_s=timeout_s, api_key=plan.opts.api_key)
    client = make_client(plan.target, opts)
    try:
        sent_at = time.time()
        return sent_at, await send_request(client, opts, RequestSpec(PROMPT, plan.max_tokens))
    finally:
        await client.close()


async def one_run(
    http: httpx.AsyncClient, plan: ColdstartPlan, index: int, deadline: float
) -> ColdRun:
    run = ColdRun(index)
    waited = time.monotonic()
    at_zero = await wait_for_zero(http, plan, deadline)
    run.waited_for_zero_s = round(time.monotonic() - waited, 1)
    if not at_zero:
        run.status = "never_at_zero"
        return run
    sent_at, result = await timed_request(plan, deadline)
    fill_from_request(run, result)
    health = await read_health(http, plan.target)  # the replica that just started: the only one
    started = None
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TargetError):
        started = serve_start_time(await deployment_details(http, plan), run.replica)
    run.scale_up_decision_s = seconds_between(sent_at, started)
    run.phases = replica_phases(health, started)
    return run


async def run_coldstart(plan: ColdstartPlan, log: Any = print) -> tuple[Deployment, list[ColdRun]]:
    deadline = time.monotonic() + plan.budget_s
    runs: list[ColdRun] = []
    async with httpx.AsyncClient(timeout=10) as http:
        deployment = await locate(http, plan)
        for index in range(1, plan.runs + 1):
            if time.monotonic() >= deadline:
                break
            log(f"coldstart run {index}/{plan.runs}: waiting for zero replicas")
            run = await one_run(http, plan, index, deadline)
            log(f"coldstart run {index}: {run.status}, first token {run.ttft_s} s")
            runs.append(run)
    return deployment, runs


# -- the command ----------------------------------------------------------------------------------


def local_dashboard() -> str | None:
    from serving.local.platform import load_state

    state = load_state()
    return state.dashboard_url if state else None


def build_plan(args: ColdstartArgs) -> ColdstartPlan:
    targets = targets_of(args)  # type: ignore[arg-type]  # reads target_items only
    if len(targets) != 1:
        raise UsageError("bench coldstart loads one --target")
    target = targets[0]
    dashboard = (args.dashboard or local_dashboard() or "").rstrip("/")
    if not dashboard:
        raise UsageError("no --dashboard given and no local platform is running")
    for option, url in (("--target", target.base_url), ("--dashboard", dashboard)):
        if not is_loopback_url(url):
            raise UsageError(f"{option} {url!r}: bench coldstart measures loopback targets only")
    model = args.model or target.model
    if model is None:  # asking /models may start a replica: the first run waits it out
        served = asyncio.run(served_models(target, timeout_s=args.request_timeout))
        if not served:
            raise TargetError(f"target {target.name} serves no model")
        model = served[0]
    return ColdstartPlan(
        target,
        dashboard,
        RequestOptions(model, "chat", timeout_s=args.request_timeout),
        args.runs,
        args.max_tokens,
        args.duration,
    )


def run_bench(args: ColdstartArgs) -> tuple[ColdstartPlan, Deployment, list[ColdRun]]:
    """The whole scenario; its report is coldstart_report's (the CLI joins them)."""
    import click

    plan = build_plan(args)
    click.echo(
        f"coldstart: {plan.runs} starts from zero of {plan.opts.model} at {plan.target.base_url}; "
        f"replicas from {plan.dashboard_url}",
        err=True,
    )
    deployment, runs = asyncio.run(run_coldstart(plan, lambda line: click.echo(line, err=True)))
    return plan, deployment, runs

"""`llm-serving bench soak`: a steady closed-loop load on one target for --duration
seconds while the memory of every Serve replica (RSS of the replica process and its children) is
sampled. Reports per replica the memory after warm-up, at the end and the growth, and gates the
growth on --max-growth-mb: result.json, summary.md, memory.png. Replica processes are found through
the local platform's Ray dashboard (state API) and read with psutil, so the platform runs here."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from serving.loadgen import client, memory
from serving.loadgen.args import StepArgs, UsageError, build_requests, check_targets, one_target
from serving.loadgen.report import Report
from serving.loadgen.workloads import RequestSpec

DEFAULT_MAX_GROWTH_MB = 200.0
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class SoakPlan:
    target: client.Target
    dashboard_url: str
    model: str
    specs: list[RequestSpec]
    opts: client.RequestOptions
    concurrency: int
    duration_s: float
    warmup_s: float
    interval_s: float
    max_growth_mb: float


@dataclass
class SoakRun:
    results: list[client.RequestResult]
    samples: list[tuple[float, str, float]]  # (seconds since start, replica, MiB)
    elapsed_s: float


def dashboard_url(given: str | None) -> str:
    """The Ray dashboard that lists the replicas: --dashboard, else the local platform's. It must
    be on this machine: replica memory is read from the PIDs it reports."""
    from serving.local.platform import load_state

    state = load_state()
    url = given or (state.dashboard_url if state else None)
    if url is None:
        raise UsageError(
            "bench soak reads replica memory from the local platform; start one with "
            "`llm-serving up` or pass --dashboard"
        )
    if urlsplit(url).hostname not in LOCAL_HOSTS:
        raise UsageError(
            f"--dashboard {url!r}: soak reads replica memory on this machine; "
            "expected a loopback URL, e.g. http://127.0.0.1:8265"
        )
    return url.rstrip("/")


async def closed_loop(plan: SoakPlan, deadline: float, results: list[client.RequestResult]) -> None:
    """`concurrency` workers, each sending the next prompt as soon as its last answer ended;
    none starts after the deadline, each request is bounded by the request timeout."""
    http = client.make_client(plan.target, plan.opts)

    async def worker(first: int) -> None:
        i = first
        while time.perf_counter() < deadline:
            results.append(
                await client.send_request(http, plan.opts, plan.specs[i % len(plan.specs)])
            )
            i += plan.concurrency

    try:
        await asyncio.gather(*(worker(k) for k in range(plan.concurrency)))
    finally:
        await http.close()


def read_memory(dashboard_url: str) -> list[tuple[str, float]]:
    """(replica, MiB) of every live replica now; replicas that vanish meanwhile are skipped."""
    readings = []
    for process in memory.list_replica_processes(dashboard_url):
        mb = memory.process_tree_rss_mb(process.pid)
        if mb is not None:
            readings.append((process.replica, round(mb, 1)))
    return readings


async def sample_memory(
    plan: SoakPlan, t0: float, stop: asyncio.Event, samples: list[tuple[float, str, float]]
) -> None:
    while not stop.is_set():
        now = round(time.perf_counter() - t0, 2)
        with contextlib.suppress(Exception):  # a dashboard hiccup costs one sample, not the run
            for replica, mb in await asyncio.to_thread(read_memory, plan.dashboard_url):
                samples.append((now, replica, mb))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), plan.interval_s)


async def run_soak_load(plan: SoakPlan) -> SoakRun:
    results: list[client.RequestResult] = []
    samples: list[tuple[float, str, float]] = []
    stop = asyncio.Event()
    t0 = time.perf_counter()
    sampler = asyncio.create_task(sample_memory(plan, t0, stop, samples))
    try:
        await closed_loop(plan, t0 + plan.duration_s, results)
    finally:
        stop.set()
        await sampler
    elapsed = time.perf_counter() - t0
    with contextlib.suppress(Exception):  # one last reading at the end of the load
        final = await asyncio.to_thread(read_memory, plan.dashboard_url)
        samples += [(round(elapsed, 2), replica, mb) for replica, mb in final]
    return SoakRun(results, samples, elapsed)


def request_summary(results: list[client.RequestResult], elapsed_s: float) -> dict[str, Any]:
    done = [r for r in results if r.success]
    failures = Counter(r.status for r in results if not r.success)
    return {
        "completed": len(done),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "output_tokens": sum(r.output_tokens for r in done),
        "request_throughput": round(len(done) / elapsed_s, 3) if elapsed_s > 0 else 0.0,
    }


def soak_document(plan: SoakPlan, run: SoakRun) -> dict[str, Any]:
    growths = memory.growth_by_replica(run.samples, plan.warmup_s, plan.max_growth_mb)
    requests = request_summary(run.results, run.elapsed_s)
    held = memory.memory_held(growths)
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "base_url": plan.target.base_url,
        "model_id": plan.model,
        "concurrency": plan.concurrency,
        "duration_s": plan.duration_s,
        "elapsed_s": round(run.elapsed_s, 1),
        "warmup_s": plan.warmup_s,
        "interval_s": plan.interval_s,
        "max_growth_mb": plan.max_growth_mb,
        "requests": requests,
        "replicas": [g.as_dict() for g in growths],
        "memory_held": held,
        "passed": held and requests["failed"] == 0 and requests["completed"] > 0,
        "samples": [list(s) for s in run.samples],
    }


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def replica_rows(document: dict[str, Any]) -> list[str]:
    rows = []
    for g in document["replicas"]:
        verdict = {True: "yes", False: "NO", None: "not measured"}[g["within_bound"]]
        rows.append(
            f"| {g['replica']} | {g['samples']} | {_mb(g['after_warmup_mb'])} | {_mb(g['end_mb'])} "
            f"| {_mb(g['growth_mb'])} | {_mb(g['slope_mb_per_min'])} | {_mb(g['peak_mb'])} "
            f"| {verdict} |"
        )
    return rows


def summary_lines(document: dict[str, Any]) -> list[str]:
    r = document["requests"]
    return [
        f"soak: {document['elapsed_s']:.0f} s at concurrency {document['concurrency']} on "
        f"{document['base_url']} ({document['model_id']}), warm-up {document['warmup_s']:.0f} s",
        f"requests: {r['completed']} completed, {r['failed']} failed {r['failures'] or ''}, "
        f"{r['request_throughput']:.2f} req/s, {r['output_tokens']} output tokens",
        f"replica memory held under +{document['max_growth_mb']:.0f} MiB after warm-up: "
        f"{'yes' if document['memory_held'] else 'NO'}",
    ]


def markdown(document: dict[str, Any]) -> str:
    head = (
        "| replica | samples | after warm-up MiB | end MiB | growth MiB | trend MiB/min | peak MiB "
        "| within bound |\n|---|---|---|---|---|---|---|---|"
    )
    parts = [
        f"# Soak {document['date']}",
        "\n".join(f"- {line}" for line in summary_lines(document)),
        head + "\n" + "\n".join(replica_rows(document)),
        "Memory = RSS of the replica process and its children (vLLM's engine core), sampled every "
        f"{document['interval_s']:g} s; after warm-up / end = median of the first / last "
        f"{memory.EDGE_SAMPLES} samples after the warm-up. Plot: `memory.png`; data: "
        "`result.json`.",
    ]
    return "\n\n".join(parts) + "\n"


def plot_memory(document: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for t, replica, mb in document["samples"]:
        series.setdefault(replica, []).append((t, mb))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for replica, points in sorted(series.items()):
        ax.plot([t for t, _ in points], [mb for _, mb in points], label=replica)
    ax.axvline(document["warmup_s"], color="grey", linestyle="--", label="end of warm-up")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("RSS of replica + children (MiB)")
    ax.set_title(f"Replica memory under steady load ({document['model_id']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(document: dict[str, Any]) -> Report:
    console = summary_lines(document) + replica_rows(document)
    return Report(
        "soak",
        document,
        markdown(document),
        console,
        {"memory.png": plot_memory},
        {},
        document["passed"],
    )


@dataclass(frozen=True)
class SoakArgs(StepArgs):
    """`bench soak`: --duration is required; replica growth is gated on max_growth_mb."""

    max_growth_mb: float
    warmup: float | None


def build_plan(args: SoakArgs) -> SoakPlan:
    if not math.isfinite(args.duration):
        raise UsageError("bench soak needs --duration SECONDS")
    target = one_target(args, "soak")
    warmup = memory.default_warmup_s(args.duration) if args.warmup is None else args.warmup
    if warmup >= args.duration:
        raise UsageError(f"--warmup {warmup:g} must be shorter than --duration {args.duration:g}")
    dashboard = dashboard_url(args.dashboard)
    specs = build_requests(args)
    model = asyncio.run(check_targets([target], args.model))
    opts = client.RequestOptions(
        model, args.endpoint, not args.free_length, timeout_s=args.request_timeout
    )
    return SoakPlan(
        target,
        dashboard,
        model,
        specs,
        opts,
        args.concurrency,
        args.duration,
        warmup,
        memory.sampling_interval_s(args.duration),
        args.max_growth_mb,
    )


def check_replicas_visible(plan: SoakPlan) -> None:
    try:
        found = read_memory(plan.dashboard_url)
    except Exception as err:
        raise client.TargetError(
            f"cannot list Serve replicas through the Ray dashboard {plan.dashboard_url} "
            f"({type(err).__name__})"
        ) from None
    if not found:
        raise client.TargetError(
            f"no Serve replica found through the Ray dashboard {plan.dashboard_url}"
        )


def run_soak(args: SoakArgs) -> Report:
    """The whole scenario; the report passes when every replica's growth held the bound and no
    request failed."""
    plan = build_plan(args)
    check_replicas_visible(plan)
    click.echo(
        f"soak: {plan.duration_s:g} s at concurrency {plan.concurrency}, replica memory every "
        f"{plan.interval_s:g} s, warm-up {plan.warmup_s:g} s ...",
        err=True,
    )
    return report(soak_document(plan, asyncio.run(run_soak_load(plan))))

"""Comparison runs: every target gets the same requests at every load level, interleaved
A B A B (each level cut into rounds), so drift on a shared machine (thermal, other processes,
caches) hits every target alike. The first target is the subject; ratios are subject / other."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import openai

from serving.loadgen import metrics, server_stats
from serving.loadgen.client import (
    RequestOptions,
    RequestResult,
    Target,
    make_client,
    run_level,
    send_request,
)
from serving.loadgen.workloads import LoadLevel, RequestSpec, rounds_for, split_level


@dataclass(frozen=True)
class BenchPlan:
    targets: list[Target]
    levels: list[LoadLevel]
    specs: list[RequestSpec]  # every level sends the first `num_requests` of these
    opts: RequestOptions
    arrivals: str = "closed"
    rounds: int = 2
    max_duration_s: float = math.inf  # per target and level, split over its rounds
    stats_interval_s: float = server_stats.STATS_INTERVAL_S
    slo: dict[str, float] = field(default_factory=dict)


@dataclass
class TargetConn:
    """What the run keeps open per target: its OpenAI client, its stats source and poll client."""

    client: openai.AsyncOpenAI
    source: server_stats.StatsSource | None
    poll_http: httpx.AsyncClient
    opts: RequestOptions  # the plan's, asking for the target's own model when it names one

    async def close(self) -> None:
        await self.client.close()
        await self.poll_http.aclose()


@dataclass
class TargetLevelRun:
    """One target at one level, merged over its rounds."""

    results: list[RequestResult] = field(default_factory=list)
    duration: float = 0.0
    samples: list[server_stats.Sample] = field(default_factory=list)
    poll_errors: int = 0


@dataclass
class BenchOutcome:
    document: dict[str, Any]  # result.json
    runs: dict[str, dict[str, TargetLevelRun]]  # level label -> target name -> run


def chunk_slices(chunks: list[LoadLevel]) -> list[slice]:
    slices, start = [], 0
    for chunk in chunks:
        slices.append(slice(start, start + chunk.num_requests))
        start += chunk.num_requests
    return slices


async def run_chunk(
    plan: BenchPlan,
    conn: TargetConn,
    chunk: LoadLevel,
    specs: list[RequestSpec],
    cap_s: float,
    run: TargetLevelRun,
    on_done: Callable[[], None],
) -> None:
    poller = server_stats.Poller(conn.source, conn.poll_http, plan.stats_interval_s)
    poller.start()
    try:
        chunk_run = await run_level(conn.client, conn.opts, chunk, specs, cap_s, on_done)
    finally:
        await poller.stop()
    run.samples += server_stats.shifted(poller.samples, run.duration)  # one timeline per level
    run.results += chunk_run.results
    run.duration += chunk_run.duration
    run.poll_errors += poller.errors


async def run_level_interleaved(
    plan: BenchPlan, level: LoadLevel, conns: dict[str, TargetConn], on_done: Callable[[], None]
) -> dict[str, TargetLevelRun]:
    chunks = split_level(level, rounds_for(level, plan.rounds))
    cap_s = plan.max_duration_s / len(chunks)
    runs = {t.name: TargetLevelRun() for t in plan.targets}
    for chunk, part in zip(chunks, chunk_slices(chunks)):
        for target in plan.targets:  # A B, A B, ...
            await run_chunk(
                plan, conns[target.name], chunk, plan.specs[part], cap_s, runs[target.name], on_done
            )
    return runs


def level_entry(
    plan: BenchPlan, level: LoadLevel, runs: dict[str, TargetLevelRun], conns: dict[str, TargetConn]
) -> dict[str, Any]:
    results = {}
    for name, run in runs.items():
        summary = metrics.summarize(run.results, run.duration, plan.slo)
        source = conns[name].source
        summary["server"] = server_stats.summarize_samples(
            source.name if source else None, run.samples, run.poll_errors
        )
        results[name] = summary
    subject = plan.targets[0].name
    return {
        "label": level.label,
        "concurrency": level.concurrency,
        "request_rate": level.rate,
        "burstiness": level.burstiness,
        "num_prompts": level.num_requests,
        "rounds": rounds_for(level, plan.rounds),
        "results": results,
        "ratios": {
            t.name: metrics.ratios(results[subject], results[t.name]) for t in plan.targets[1:]
        },
    }


def plan_header(plan: BenchPlan) -> dict[str, Any]:
    return {
        "date": dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        "endpoint_type": plan.opts.endpoint,
        "model_id": plan.opts.model,
        "arrivals": plan.arrivals,
        "fixed_output_length": plan.opts.fixed_length,
        "rounds": plan.rounds,
        "slo_ms": plan.slo or None,
        "subject": plan.targets[0].name,
        "targets": [
            {"name": t.name, "base_url": t.base_url, "model": t.model or plan.opts.model}
            for t in plan.targets
        ],
    }


async def connect(plan: BenchPlan, target: Target) -> TargetConn:
    source = await server_stats.detect_source(target.origin)
    poll_http = httpx.AsyncClient(timeout=max(1.0, plan.stats_interval_s * 20))
    opts = replace(plan.opts, model=target.model) if target.model else plan.opts
    return TargetConn(make_client(target, opts), source, poll_http, opts)


async def warm_up(plan: BenchPlan, conns: dict[str, TargetConn]) -> None:
    """One unmeasured request per target first (as vLLM's bench does): connection set-up and
    lazy imports on either side must not land in the first level's TTFT."""
    spec = plan.specs[0]
    for conn in conns.values():
        await send_request(
            conn.client, conn.opts, replace(spec, output_len=min(spec.output_len, 4))
        )
        if conn.source is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                await conn.source.read(conn.poll_http)


async def run_plan(plan: BenchPlan, on_done: Callable[[], None] = lambda: None) -> BenchOutcome:
    """Every level in order; within a level every target, interleaved by rounds."""
    conns = {t.name: await connect(plan, t) for t in plan.targets}
    document = plan_header(plan)
    document["server_stats_sources"] = {
        name: (conn.source.name if conn.source else None) for name, conn in conns.items()
    }
    document["levels"] = []
    all_runs: dict[str, dict[str, TargetLevelRun]] = {}
    try:
        await warm_up(plan, conns)
        for level in plan.levels:
            runs = await run_level_interleaved(plan, level, conns, on_done)
            all_runs[level.label] = runs
            document["levels"].append(level_entry(plan, level, runs, conns))
    finally:
        for conn in conns.values():
            await conn.close()
    return BenchOutcome(document, all_runs)


def total_requests(plan: BenchPlan) -> int:
    return sum(level.num_requests for level in plan.levels) * len(plan.targets)

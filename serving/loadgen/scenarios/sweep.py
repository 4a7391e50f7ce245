"""`llm-serving bench sweep`: load one or more targets (and peers started on loopback) the same
way at each load level, interleaved round by round: a closed loop at each --concurrency, or open
arrivals (poisson at each --rate, or a burst), then the ratios and the --require gates."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import click

from serving.loadgen import metrics, require, server_counters, workloads
from serving.loadgen.args import (
    LoadArgs,
    UsageError,
    build_requests,
    check_targets,
    parse_list,
    targets_of,
)
from serving.loadgen.client import RequestOptions, Target
from serving.loadgen.compare import BenchOutcome, BenchPlan, run_plan, total_requests
from serving.loadgen.peers import PEER_NAMES, ray_llm_peer, vllm_peer
from serving.loadgen.report import Report
from serving.loadgen.scenarios import sweep_report

ARRIVALS = ("closed", "poisson", "burst")


@dataclass(frozen=True)
class SweepArgs(LoadArgs):
    """`bench sweep`: several targets and peers at each load level, interleaved, gated."""

    peers: tuple[str, ...]
    config_path: str | None
    arrivals: str
    concurrency: str
    duration: float
    rounds: int
    rate: str
    burstiness: float
    slo: str | None
    requirements: tuple[str, ...]
    stats_interval: float


def build_levels(args: SweepArgs) -> list[workloads.LoadLevel]:
    levels = parse_list(args.concurrency, int, "--concurrency")
    if args.arrivals == "closed":
        return workloads.sweep_levels(levels, args.num_requests)
    cap = max(levels)  # open loop: arrivals set the load, the cap only bounds what is in flight
    rates = parse_list(args.rate, float, "--rate")
    if args.arrivals == "poisson":
        return workloads.poisson_levels(rates, args.num_requests, args.burstiness, args.seed, cap)
    return [workloads.burst_level(args.num_requests, rates[0], cap)]


@contextlib.contextmanager
def started_peers(
    peers: tuple[str, ...], config_path: str | None, model: str, out_dir: Path
) -> Iterator[list[Target]]:
    from serving.config import load_config

    if not peers:
        yield []
        return
    config = load_config(config_path)
    with contextlib.ExitStack() as stack:
        started = []
        for peer in dict.fromkeys(peers):  # each once, in the order given
            click.echo(f"starting peer {peer} on loopback ...", err=True)
            if peer == "vllm":
                started.append(
                    stack.enter_context(vllm_peer(config, model, out_dir / "peer-vllm.log"))
                )
            else:
                started.append(stack.enter_context(ray_llm_peer(config, model)))
        yield started


def run_with_progress(plan: BenchPlan) -> BenchOutcome:
    from tqdm import tqdm

    with tqdm(total=total_requests(plan), unit="req", desc="bench", disable=None) as bar:
        return asyncio.run(run_plan(plan, on_done=lambda: bar.update(1)))


def record_checks(outcome: BenchOutcome, checks: list[require.Check]) -> list[str]:
    outcome.document["requirements"] = [
        {"expr": c.requirement.text, "measured": c.actual, "passed": c.passed, "where": c.where}
        for c in checks
    ]
    return [require.describe(check) for check in checks]


def check_models(args: SweepArgs, targets: list[Target], specs: list[workloads.RequestSpec]) -> str:
    """Every target serves each model of --model-mix and the requested model; the latter's name."""
    if args.model_mix and args.peers:
        raise UsageError("--model-mix: peers serve one model; compare mixes across --target only")
    for name in sorted({spec.model for spec in specs if spec.model}):
        asyncio.run(check_targets([replace(t, model=None) for t in targets], name))
    return asyncio.run(check_targets(targets, args.model))


def run_sweep(args: SweepArgs, out: Path) -> Report:
    """The whole scenario; the report fails when a --require misses."""
    targets = targets_of(args)
    levels = build_levels(args)
    slo_ms = metrics.parse_slo(args.slo)
    reqs = [require.parse_requirement(e) for e in require.split_expressions(args.requirements)]
    names = [t.name for t in targets] + [PEER_NAMES[peer] for peer in dict.fromkeys(args.peers)]
    require.validate(reqs, names, [level.label for level in levels])  # fail before minutes of load
    specs = build_requests(args)
    model = check_models(args, targets, specs)
    with started_peers(args.peers, args.config_path, model, out) as peer_targets:
        asyncio.run(check_targets(peer_targets, model))
        opts = RequestOptions(
            model, args.endpoint, not args.free_length, timeout_s=args.request_timeout
        )
        plan = BenchPlan(
            targets + peer_targets,
            levels,
            specs,
            opts,
            args.arrivals,
            args.rounds,
            args.duration,
            args.stats_interval,
            slo_ms,
        )
        requested = (
            {model} | {s.model for s in specs if s.model} | {t.model for t in targets if t.model}
        )
        metrics_url = server_counters.local_metrics_url(targets)
        if metrics_url and not server_counters.requests_adapters(targets, requested):
            metrics_url = None  # no adapter requested: skip the wait for the counters' export
        before = server_counters.read_adapter_loads(metrics_url) if metrics_url else None
        outcome = run_with_progress(plan)
        if metrics_url and before is not None:
            outcome.document["adapter_loads"] = server_counters.loads_during(before, metrics_url)
    checks = require.evaluate(reqs, outcome.document)
    lines = record_checks(outcome, checks)
    return sweep_report.report(outcome, lines, passed=all(c.passed for c in checks))

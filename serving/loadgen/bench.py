"""What `llm-serving bench` does, behind its click options (kept apart so `llm-serving` starts
without importing the load generator): check the input, start peers, run the plan, report, gate."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import click

from serving.loadgen import metrics, require, server_counters, workloads
from serving.loadgen.client import RequestOptions, Target, TargetError, served_models
from serving.loadgen.compare import BenchOutcome, BenchPlan, run_plan, total_requests
from serving.loadgen.peers import PEER_NAMES, ray_llm_peer, vllm_peer
from serving.loadgen.report import console_summary, write_report

TARGET_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class UsageError(ValueError):
    """Bad command-line input; the message names the option."""


@dataclass(frozen=True)
class BenchArgs:
    """The command's options, as click parsed them."""

    target_items: tuple[str, ...]
    peers: tuple[str, ...]
    config_path: str | None
    model: str | None
    endpoint: str
    scenario: str
    concurrency: str
    num_requests: int
    duration: float
    rounds: int
    rate: str
    burstiness: float
    prompts: str
    input_len: int
    output_len: int
    range_ratio: float
    tokenizer_ref: str | None
    free_length: bool
    slo: str | None
    output_dir: str | None
    requirements: tuple[str, ...]
    seed: int
    request_timeout: float
    stats_interval: float
    model_mix: str | None = None
    turns: int = 5
    prefix_len: int = 512
    context_len: int = 0


def parse_targets(items: tuple[str, ...]) -> list[Target]:
    """`NAME=URL` or `NAME=URL#MODEL` (that model on that target: two models behind one endpoint
    compared side by side)."""
    targets = []
    for item in items:
        name, sep, rest = item.partition("=")
        url, _, model = rest.partition("#")
        if not sep or not TARGET_NAME.match(name) or not url.startswith(("http://", "https://")):
            raise UsageError(f"--target {item!r}: expected NAME=http://HOST:PORT/v1[#MODEL]")
        targets.append(Target(name, url.rstrip("/"), model or None))
    if len({t.name for t in targets}) != len(targets):
        raise UsageError("--target names must differ")
    return targets


def default_targets() -> list[Target]:
    """Without --target: the platform `llm-serving up` started here (its vLLM route)."""
    from serving.local import load_state

    state = load_state()
    if state is None:
        raise UsageError("no --target given and no local platform is running")
    return [Target("platform", state.api_url)]


def parse_list(text: str, kind: type, option: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        raise UsageError(f"{option} {text!r}: values must be positive")
    return values


def build_levels(args: BenchArgs) -> list[workloads.LoadLevel]:
    if args.num_requests < 1:
        raise UsageError("--requests must be at least 1")
    levels = parse_list(args.concurrency, int, "--concurrency")
    if args.scenario == "sweep":
        return workloads.sweep_levels(levels, args.num_requests)
    cap = max(levels)  # open loop: arrivals set the load, the cap only bounds what is in flight
    rates = parse_list(args.rate, float, "--rate")
    if args.scenario == "poisson":
        return workloads.poisson_levels(rates, args.num_requests, args.burstiness, args.seed, cap)
    return [workloads.burst_level(args.num_requests, rates[0], cap)]


def load_tokenizer(ref: str | None) -> workloads.Tokenizer | None:
    if ref is None:
        return None
    from transformers import AutoTokenizer

    from serving.models import resolve_model

    # A transformers tokenizer has the protocol's encode, and decodes one id list to one str.
    return cast(workloads.Tokenizer, AutoTokenizer.from_pretrained(str(resolve_model(ref))))


def build_requests(args: BenchArgs) -> list[workloads.RequestSpec]:
    specs = prompt_requests(args)
    if args.model_mix:
        specs = workloads.assign_models(specs, workloads.parse_model_mix(args.model_mix), args.seed)
    return specs


def prompt_requests(args: BenchArgs) -> list[workloads.RequestSpec]:
    num, out_len = args.num_requests, args.output_len
    if args.prompts == "synthetic":
        tokenizer = load_tokenizer(args.tokenizer_ref)
        return workloads.synthetic_requests(
            num, args.input_len, out_len, args.seed, args.range_ratio, tokenizer
        )
    if args.prompts == "seed":
        return workloads.seed_requests(num, out_len)
    if args.prompts in ("multi-turn", "shared-prefix"):
        tokenizer = load_tokenizer(args.tokenizer_ref)
        if args.prompts == "multi-turn":
            return workloads.multi_turn_requests(
                num, args.turns, args.input_len, out_len, args.seed, tokenizer, args.context_len
            )
        return workloads.shared_prefix_requests(
            num, args.prefix_len, args.input_len, out_len, args.seed, tokenizer
        )
    return workloads.jsonl_requests(args.prompts, num, out_len)


async def check_targets(targets: list[Target], model: str | None) -> str:
    """Every target answers /models and serves the model (its own, when it names one); returns
    the model name to request."""
    served = {t.name: await served_models(t) for t in targets}
    if targets and model is None:
        model = targets[0].model or served[targets[0].name][0]
    assert model is not None, "callers pass targets (the first names it) or the model itself"
    for target in targets:
        wanted = target.model or model
        if wanted not in served[target.name]:
            raise TargetError(
                f"target {target.name} does not serve model {wanted!r} (it serves {served[target.name]})"
            )
    return model


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


def run_bench(args: BenchArgs) -> bool:
    """The whole command; True when every requirement held."""
    targets = parse_targets(args.target_items) if args.target_items else default_targets()
    levels = build_levels(args)
    slo_ms = metrics.parse_slo(args.slo)
    reqs = [require.parse_requirement(e) for e in require.split_expressions(args.requirements)]
    names = [t.name for t in targets] + [PEER_NAMES[peer] for peer in dict.fromkeys(args.peers)]
    require.validate(reqs, names, [level.label for level in levels])  # fail before minutes of load
    specs = build_requests(args)
    if args.model_mix and args.peers:
        raise UsageError("--model-mix: peers serve one model; compare mixes across --target only")
    for name in sorted({spec.model for spec in specs if spec.model}):
        asyncio.run(check_targets([replace(t, model=None) for t in targets], name))
    model = asyncio.run(check_targets(targets, args.model))
    out = Path(args.output_dir or f"bench-results/{dt.datetime.now():%Y%m%d-%H%M%S}")
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
            args.scenario,
            args.rounds,
            args.duration,
            args.stats_interval,
            slo_ms,
        )
        metrics_url = server_counters.local_metrics_url(targets)
        before = server_counters.read_adapter_loads(metrics_url) if metrics_url else None
        outcome = run_with_progress(plan)
        if metrics_url and before is not None:
            outcome.document["adapter_loads"] = server_counters.loads_during(before, metrics_url)
    checks = require.evaluate(reqs, outcome.document)
    lines = record_checks(outcome, checks)
    click.echo(console_summary(outcome.document))
    for line in lines:
        click.echo(line)
    write_report(outcome, out, lines)
    click.echo(f"report: {out}/summary.md (result.json, throughput.png, latency.png, server.png)")
    return all(c.passed for c in checks)

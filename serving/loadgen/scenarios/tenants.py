"""`llm-serving bench tenants`: two or more tenants share one engine, one of them noisy (prompts
NOISY_PROMPT_FACTOR times longer, NOISY_CONCURRENCY_FACTOR times the concurrency). On each target
in turn (the platform with tenants, the same platform without them, plain vLLM with `--peer
vllm`), each tenant runs alone (the quiet ones, then the noisy one), then all of them together:
every tenant a closed loop with its own API key as Bearer, no request started after the phase's
--duration, at most --max-requests per tenant and phase. Each phase has prompts of its own (random
words, never sent before), so no prefix cache hit favours a phase. Reported per target (figures
and Jain's index as tenants_report defines them): each tenant's served tokens in the mixed phase,
Jain's fairness index, each tenant's TTFT p50/p99 mixed against alone, and the single-tenant
overhead (the first quiet tenant alone, against --baseline). `--merge DIR` adds the targets of an
earlier run of the same workload (a platform started without tenants, say) to the comparison.
API keys are sent, never written to the report."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import httpx
import openai

from serving.loadgen import client, metrics, require, workloads
from serving.loadgen.args import TARGET_NAME, UsageError, default_targets, parse_targets
from serving.loadgen.client import RequestOptions, RequestResult, Target, TargetError
from serving.loadgen.peers import PEER_NAMES
from serving.loadgen.report import Report
from serving.loadgen.scenarios import tenants_report
from serving.loadgen.scenarios.coldstart import is_loopback_url
from serving.loadgen.scenarios.tenants_report import PhaseRun

NOISY_PROMPT_FACTOR, NOISY_CONCURRENCY_FACTOR = 8, 4
SEED_STRIDE = 1000  # seeds of one target's phases and tenants never meet another's
WARMUP_REQUESTS, WARMUP_SEED = 4, SEED_STRIDE - 100  # its prompts are never a phase's


@dataclass(frozen=True)
class TenantsArgs:
    """The options of `bench tenants`."""

    target_items: tuple[str, ...]
    tenant_items: tuple[str, ...]
    noisy: str | None
    concurrency: int
    input_len: int
    output_len: int
    duration: float
    max_requests: int
    model: str | None
    endpoint: str
    request_timeout: float
    peer: str | None
    config_path: str | None
    baseline: str | None
    merge_dirs: tuple[str, ...]
    requirements: tuple[str, ...]
    seed: int


@dataclass(frozen=True)
class Tenant:
    name: str
    key: str
    noisy: bool
    concurrency: int
    input_len: int


@dataclass(frozen=True)
class Plan:
    targets: list[Target]
    tenants: list[Tenant]
    reqs: list[require.Requirement]
    merged: list[tuple[str, dict[str, Any]]]  # (folder, its result.json)
    baseline: str


def parse_tenants(
    items: tuple[str, ...], noisy: str | None, concurrency: int, input_len: int
) -> list[Tenant]:
    """`NAME=KEY` or `NAME=env:VARIABLE` (the key read from the environment), two or more; the
    noisy one (default: the last) gets the longer prompts and the higher concurrency."""
    keys: dict[str, str] = {}
    for item in items:
        name, sep, key = item.partition("=")
        if not sep or not TARGET_NAME.match(name) or not key:
            raise UsageError(f"--tenant {item!r}: expected NAME=KEY or NAME=env:VARIABLE")
        if key.startswith("env:"):
            variable = key.removeprefix("env:")
            key = os.environ.get(variable, "")
            if not key:
                raise UsageError(f"--tenant {name}: environment variable {variable} is empty")
        if name in keys:
            raise UsageError(f"--tenant names must differ ({name} twice)")
        keys[name] = key
    if len(keys) < 2:
        raise UsageError("--tenant: give two or more tenants, NAME=KEY each")
    if len(set(keys.values())) != len(keys):
        raise UsageError("--tenant: each tenant needs a key of its own")
    noisy = noisy or list(keys)[-1]
    if noisy not in keys:
        raise UsageError(f"--noisy {noisy!r}: not a --tenant ({', '.join(keys)})")
    return [
        Tenant(
            name, key, True, concurrency * NOISY_CONCURRENCY_FACTOR, input_len * NOISY_PROMPT_FACTOR
        )
        if name == noisy
        else Tenant(name, key, False, concurrency, input_len)
        for name, key in keys.items()
    ]


def load_merged(folders: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    merged = []
    for folder in folders:
        path = Path(folder) / "result.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise UsageError(f"--merge {folder}: cannot read {path} ({err})") from None
        if not isinstance(doc, dict) or doc.get("scenario") != "tenants":
            raise UsageError(f"--merge {folder}: not a `bench tenants` report")
        merged.append((folder, doc))
    return merged


def workload(args: TenantsArgs, tenants: list[Tenant], model: str) -> dict[str, Any]:
    """What a merged report must share with this run to be compared with it."""
    return {
        "model_id": model,
        "endpoint": args.endpoint,
        "tenants": [
            {
                "name": t.name,
                "noisy": t.noisy,
                "concurrency": t.concurrency,
                "input_len": t.input_len,
            }
            for t in tenants
        ],
        "output_len": args.output_len,
        "phase_s": args.duration,
    }


def build_plan(args: TenantsArgs) -> Plan:
    """Every input checked before anything is sent."""
    targets = parse_targets(args.target_items) if args.target_items else default_targets()
    for target in targets:
        if not is_loopback_url(target.base_url):
            raise UsageError(
                f"--target {target.base_url!r}: bench tenants loads loopback targets only"
            )
    tenants = parse_tenants(args.tenant_items, args.noisy, args.concurrency, args.input_len)
    merged = load_merged(args.merge_dirs)
    names = [t.name for t in targets] + ([PEER_NAMES[args.peer]] if args.peer else [])
    for folder, doc in merged:
        for target in doc.get("targets", []):
            if target["name"] in names:
                raise UsageError(f"--merge {folder}: target {target['name']} is in this run too")
            names.append(target["name"])
    baseline = args.baseline or names[0]
    if baseline not in names:
        raise UsageError(f"--baseline {baseline!r}: not a target ({', '.join(names)})")
    reqs = [require.parse_requirement(e) for e in require.split_expressions(args.requirements)]
    tenants_report.validate_gates(reqs, names, [t.name for t in tenants])
    return Plan(targets, tenants, reqs, merged, baseline)


async def served_with_key(target: Target, tenant: Tenant, timeout_s: float = 10.0) -> list[str]:
    """GET /models with the tenant's key: the target is an OpenAI server and takes the key."""
    url = f"{target.base_url}/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(url, headers={"Authorization": f"Bearer {tenant.key}"})
    except httpx.HTTPError as err:
        raise TargetError(
            f"target {target.name}: cannot reach {url} ({type(err).__name__})"
        ) from None
    if response.status_code in (401, 403):
        raise TargetError(
            f"target {target.name} refuses tenant {tenant.name}'s key (HTTP {response.status_code})"
        )
    try:
        response.raise_for_status()
        return [item["id"] for item in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        raise TargetError(
            f"target {target.name}: {url} is not an OpenAI-compatible server "
            f"(HTTP {response.status_code}, no model list)"
        ) from None


async def check_keys(targets: list[Target], tenants: list[Tenant], model: str | None) -> str:
    """Every target takes every tenant's key and serves the model; the model's name."""
    for target in targets:
        for tenant in tenants:
            served = await served_with_key(target, tenant)
            model = model or target.model or (served[0] if served else None)
            wanted = target.model or model
            if wanted not in served:
                raise TargetError(
                    f"target {target.name} does not serve model {wanted!r} ({served})"
                )
    assert model is not None, "a target that serves no model raised above"
    return model


async def closed_loop(
    http: openai.AsyncOpenAI,
    opts: RequestOptions,
    specs: list[workloads.RequestSpec],
    concurrency: int,
    deadline: float,
) -> list[RequestResult]:
    """`concurrency` workers, each sending the next prompt when its last answer came: every
    prompt at most once, none started after the deadline."""
    results: list[RequestResult] = []
    queue = iter(specs)  # shared: each prompt once

    async def worker() -> None:
        for spec in queue:
            if time.perf_counter() >= deadline:
                return
            results.append(await client.send_request(http, opts, spec))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def run_phase(
    target: Target,
    opts: RequestOptions,
    tenants: list[Tenant],
    specs: dict[str, list[workloads.RequestSpec]],
    duration_s: float,
) -> PhaseRun:
    """The given tenants at once, each its own closed loop with its own key, one deadline."""
    apis = {t.name: client.make_client(target, _keyed(opts, t)) for t in tenants}
    start = time.perf_counter()
    try:
        runs = await asyncio.gather(
            *(
                closed_loop(apis[t.name], opts, specs[t.name], t.concurrency, start + duration_s)
                for t in tenants
            )
        )
    finally:
        for api in apis.values():
            await api.close()
    return PhaseRun({t.name: run for t, run in zip(tenants, runs, strict=True)}, start)


def _keyed(opts: RequestOptions, tenant: Tenant) -> RequestOptions:
    return replace(opts, api_key=tenant.key)


def phase_specs(
    args: TenantsArgs, tenants: list[Tenant], seed: int
) -> dict[str, list[workloads.RequestSpec]]:
    return {
        t.name: workloads.synthetic_requests(
            args.max_requests, t.input_len, args.output_len, seed + index
        )
        for index, t in enumerate(tenants)
    }


async def run_target(
    args: TenantsArgs,
    target: Target,
    tenants: list[Tenant],
    opts: RequestOptions,
    seed: int,
    say: Callable[[str], None],
) -> tuple[dict[str, PhaseRun], PhaseRun]:
    """An unmeasured warm-up (a just-started replica's first requests are slow), each tenant
    alone (the quiet ones first), then all together."""
    say(f"{target.name}: warm-up, {WARMUP_REQUESTS} requests a tenant (not measured)")
    warmup = phase_specs(replace(args, max_requests=WARMUP_REQUESTS), tenants, seed + WARMUP_SEED)
    await run_phase(target, opts, tenants, warmup, args.duration)
    solo: dict[str, PhaseRun] = {}
    order = [t for t in tenants if not t.noisy] + [t for t in tenants if t.noisy]
    for phase, tenant in enumerate(order):
        say(f"{target.name}: {tenant.name} alone (c{tenant.concurrency}, {args.duration:g} s)")
        specs = phase_specs(args, [tenant], seed + phase * len(tenants))
        solo[tenant.name] = await run_phase(target, opts, [tenant], specs, args.duration)
    say(f"{target.name}: all {len(tenants)} tenants together ({args.duration:g} s)")
    specs = phase_specs(args, tenants, seed + len(order) * len(tenants))
    return solo, await run_phase(target, opts, tenants, specs, args.duration)


def run_files(name: str, solo: dict[str, PhaseRun], mixed: PhaseRun) -> dict[str, Any]:
    """runs/TARGET/PHASE-TENANT.json: every request, vLLM's per-request fields."""
    files = {
        f"runs/{name}/solo-{t}.json": metrics.raw_fields(p.results[t]) for t, p in solo.items()
    }
    for tenant, results in mixed.results.items():
        files[f"runs/{name}/mixed-{tenant}.json"] = metrics.raw_fields(results)
    return files


def merged_targets(plan: Plan, shared: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    for folder, doc in plan.merged:
        for key, value in shared.items():
            if doc.get(key) != value:
                raise UsageError(
                    f"--merge {folder}: its {key} differs from this run's ({doc.get(key)!r})"
                )
        targets += [{**target, "from": folder} for target in doc.get("targets", [])]
    return targets


def run_tenants(args: TenantsArgs, out: Path) -> Report:
    """The whole scenario; the report fails when a --require misses."""
    from serving.loadgen.scenarios.sweep import started_peers

    plan = build_plan(args)
    model = asyncio.run(check_keys(plan.targets, plan.tenants, args.model))
    shared = workload(args, plan.tenants, model)
    earlier = merged_targets(plan, shared)

    def say(line: str) -> None:
        click.echo(line, err=True)

    summaries: list[dict[str, Any]] = []
    files: dict[str, Any] = {}
    pairs = [(t.name, t.noisy) for t in plan.tenants]
    with started_peers((args.peer,) if args.peer else (), args.config_path, model, out) as peers:
        asyncio.run(check_keys(peers, plan.tenants, model))
        for index, target in enumerate(plan.targets + peers):
            opts = RequestOptions(
                target.model or model, args.endpoint, timeout_s=args.request_timeout
            )
            seed = args.seed + index * SEED_STRIDE
            solo, mixed = asyncio.run(run_target(args, target, plan.tenants, opts, seed, say))
            summaries.append(
                tenants_report.target_summary(target.name, target.base_url, pairs, solo, mixed)
            )
            files |= run_files(target.name, solo, mixed)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        **shared,
        "baseline": plan.baseline,
        "noisy_prompt_factor": NOISY_PROMPT_FACTOR,
        "noisy_concurrency_factor": NOISY_CONCURRENCY_FACTOR,
    }
    return tenants_report.report(meta, summaries + earlier, plan.reqs, files)

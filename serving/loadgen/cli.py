"""`llm-serving bench SCENARIO`: sweep (targets side by side at each load level), autoscale (a
step burst against one autoscaling deployment), batch (online latency beside a running batch),
soak (steady load while replica memory is sampled), coldstart (starts from zero replicas, by
phase), tenants (a noisy tenant beside quiet ones: served tokens, Jain's index, TTFT), seed (the
study's experiments in-process) and vllm-client (vLLM's own benchmark client). Each writes its
report through the one writer (result.json, summary.md, plots). Bad input is one `error:` line
and exit 2; an unusable target exit 1; a missed gate exit 3 (after the report is written). Only
click is imported here: a scenario loads when it runs, so other `llm-serving` commands stay
quick."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from serving.loadgen.cli_options import (
    CONFIG,
    DASHBOARD,
    ENDPOINT,
    LOAD,
    ONE_TARGET,
    OUTPUT,
    ROUNDS,
    STATS_INTERVAL,
    STEP_CONCURRENCY,
    TARGETS,
    duration_option,
)

if TYPE_CHECKING:
    from serving.loadgen.report import Report

EXIT_TARGET, EXIT_USAGE, EXIT_REQUIRE = 1, 2, 3


def bench_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures print one `error: ...` line and exit non-zero instead of a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from serving.config import ConfigError
        from serving.loadgen import metrics, require, workloads
        from serving.loadgen.args import UsageError
        from serving.loadgen.client import TargetError
        from serving.loadgen.peers import PeerError
        from serving.models import ModelNotFoundError

        usage = (
            UsageError,
            workloads.WorkloadError,
            metrics.SLOError,
            require.RequireError,
            ConfigError,
        )
        try:
            return func(*args, **kwargs)
        except usage as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(EXIT_USAGE)
        except (TargetError, PeerError, ModelNotFoundError) as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(EXIT_TARGET)

    return wrapper


def finish(scenario: str, output: str | None, run: Callable[[Path], Report]) -> None:
    """Run a scenario into its report folder, publish the report, exit 3 when a gate missed."""
    from serving.loadgen.report import output_dir, publish

    out = output_dir(output, scenario)
    if not publish(run(out), out):
        sys.exit(EXIT_REQUIRE)


@click.group(context_settings={"show_default": True})
def bench() -> None:
    """Benchmark OpenAI-compatible targets (vLLM `bench serve` metrics), one scenario each."""


@bench.command()
@TARGETS
@click.option(
    "--peer",
    "peers",
    multiple=True,
    type=click.Choice(["vllm", "ray-serve-llm"]),
    help="Also start a peer on loopback and compare (same model and engine arguments as "
    "--config): vllm = plain vLLM's OpenAI server; ray-serve-llm = Ray Serve's LLM app, "
    "deployed into the running platform under /ray-llm.",
)
@CONFIG
@LOAD
@click.option(
    "--arrivals",
    type=click.Choice(["closed", "poisson", "burst"]),
    default="closed",
    help="closed: a closed loop at each --concurrency; poisson: gamma arrivals at each --rate; "
    "burst: --rate for half the requests, then the rest at once.",
)
@click.option(
    "--concurrency",
    default="1,2,4,8",
    help="closed: the levels; poisson/burst: the most requests in flight (the largest).",
)
@duration_option("Seconds per target and level after which no request starts (default: none).")
@ROUNDS
@click.option("--rate", default="1", help="Requests/s (comma list for poisson).")
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    help="Gamma shape of inter-arrival times: 1 Poisson, <1 burstier, >1 more even.",
)
@click.option("--slo", help="Goodput SLOs in ms, e.g. ttft:500,tpot:50 (also e2el).")
@click.option(
    "--require",
    "requirements",
    multiple=True,
    metavar="EXPR",
    help="Gate, e.g. 'output_throughput_ratio>=3' or 'hf.output_throughput_ratio@c8>=3'; "
    "exit 3 when a figure misses it.",
)
@STATS_INTERVAL
@OUTPUT
@bench_errors
def sweep(output_dir: str | None, **given: Any) -> None:
    """Load targets side by side at each load level, interleaved (throughput.png, latency.png)."""
    from serving.loadgen.scenarios.sweep import SweepArgs, run_sweep

    finish("sweep", output_dir, lambda out: run_sweep(SweepArgs(**given), out))


@bench.command()
@ONE_TARGET
@LOAD
@STEP_CONCURRENCY
@duration_option("Seconds the step may last at most (default: 600).")
@DASHBOARD
@STATS_INTERVAL
@OUTPUT
@bench_errors
def autoscale(output_dir: str | None, **given: Any) -> None:
    """A step of --concurrency in flight until a second replica serves, then the scale-down
    (scale-up and scale-down times, timeline.png)."""
    from serving.loadgen.scenarios import autoscale_report
    from serving.loadgen.scenarios.autoscale import AutoscaleArgs, run_step

    finish(
        "autoscale",
        output_dir,
        lambda _out: autoscale_report.report(*run_step(AutoscaleArgs(**given))),
    )


@bench.command()
@ONE_TARGET
@LOAD
@STEP_CONCURRENCY
@duration_option("Seconds of steady load.", required=True)
@DASHBOARD
@click.option(
    "--max-growth-mb",
    type=click.FloatRange(min=0),
    default=200.0,
    help="Most a replica's memory may grow from the end of warm-up to the end.",
)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds before memory is compared (default: a quarter, at most 120).",
)
@OUTPUT
@bench_errors
def soak(output_dir: str | None, **given: Any) -> None:
    """A closed loop for --duration s while every replica's memory is sampled on this machine
    (memory.png; exit 3 on growth or a failed request)."""
    from serving.loadgen.scenarios.soak import SoakArgs, run_soak

    finish("soak", output_dir, lambda _out: run_soak(SoakArgs(**given)))


@bench.command()
@ONE_TARGET
@DASHBOARD
@click.option("--model", help="Model name to request; default: the target's first model.")
@click.option(
    "--runs", type=click.IntRange(1, 50), default=3, help="Starts from zero replicas to time."
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=16,
    help="Tokens each run's streaming chat request generates.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    help="Seconds one request may take, cold start and stream included.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    help="Seconds the whole bench may take (waits for zero replicas included); runs left "
    "after it are not started.",
)
@OUTPUT
@bench_errors
def coldstart(output_dir: str | None, **given: Any) -> None:
    """Start a `min_replicas: 0` deployment from zero --runs times (one streaming chat each):
    each start-up phase's median and spread, and from zero to the first token. Exit 3 when a
    run got no answer."""
    from serving.loadgen.scenarios import coldstart_report
    from serving.loadgen.scenarios.coldstart import ColdstartArgs, run_bench

    finish(
        "coldstart",
        output_dir,
        lambda _out: coldstart_report.report(*run_bench(ColdstartArgs(**given))),
    )


@bench.command()
@CONFIG
@click.option("--output-len", type=click.IntRange(min=1), default=64)
@click.option(
    "--batch-sizes",
    default="4,32,64",
    help="The batch sizes of the efficiency experiment.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 20),
    default=3,
    help="Timed runs per figure (the median is reported).",
)
@OUTPUT
@bench_errors
def seed(output_dir: str | None, **given: Any) -> None:
    """The study's experiments in-process on --config's model: generate() vs vLLM, KV cache,
    batching, static batching waste (--output-len new tokens; seed.png)."""
    from serving.loadgen.scenarios.seed import SeedArgs, run_seed

    finish("seed", output_dir, lambda _out: run_seed(SeedArgs(**given)))


@bench.command("vllm-client")
@click.option(
    "--target",
    "target_items",
    multiple=True,
    required=True,
    metavar="NAME=ORIGIN",
    help="A server origin, e.g. platform=http://127.0.0.1:8000 (repeatable).",
)
@click.option(
    "--peer",
    type=click.Choice(["vllm"]),
    help="Also start plain vLLM's server with --config's model and vllm serve options "
    "(target vllm-serve).",
)
@CONFIG
@click.option(
    "--baseline",
    default="vllm-serve",
    help="Target every throughput ratio is taken against.",
)
@click.option("--model", required=True, help="Model name to request.")
@ENDPOINT
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    default=("16x128", "128x64"),
    help="INPUTxOUTPUT tokens per request (repeatable).",
)
@click.option("--concurrency", default="8,16")
@click.option(
    "--num-prompts",
    type=click.IntRange(min=1),
    default=32,
    help="Requests per run.",
)
@ROUNDS
@OUTPUT
@bench_errors
def vllm_client(output_dir: str | None, **given: Any) -> None:
    """vLLM's own benchmark client (`vllm bench serve`) against each target, interleaved;
    ratios to --baseline."""
    from serving.loadgen.scenarios.vllm_client import VLLMClientArgs, run_vllm_client

    finish("vllm-client", output_dir, lambda out: run_vllm_client(VLLMClientArgs(**given), out))


@bench.command("batch")
@ONE_TARGET
@LOAD
@click.option("--concurrency", type=click.IntRange(min=1), default=4, help="Online streams.")
@duration_option("Seconds of each phase (alone or beside a batch).", required=True)
@DASHBOARD
@ROUNDS
@click.option(
    "--batch-lines",
    type=click.IntRange(min=1),
    default=2000,
    help="Lines of each phase's batch (more than it can finish: it is cancelled at the end).",
)
@click.option("--batch-output-len", type=click.IntRange(min=1), default=64)
@click.option(
    "--max-ttft-ratio",
    type=click.FloatRange(min=1),
    help="Gate: online TTFT p50 beside a batch over TTFT p50 alone at most this (exit 3).",
)
@OUTPUT
@bench_errors
def batch(output_dir: str | None, **given: Any) -> None:
    """Online latency with and without a running batch (the Batch API), phases interleaved:
    TTFT / TPOT p50 per condition, their ratio, the batch's own throughput."""
    from serving.loadgen.scenarios.batch_impact import BatchImpactArgs, run_batch_impact

    finish("batch", output_dir, lambda _out: run_batch_impact(BatchImpactArgs(**given)))


@bench.command("tenants")
@TARGETS
@click.option(
    "--tenant",
    "tenant_items",
    multiple=True,
    metavar="NAME=KEY",
    help="A tenant and its API key, sent as Bearer (two or more); NAME=env:VAR reads the key "
    "from the environment. A target without tenants takes any key. Keys are never reported.",
)
@click.option("--noisy", metavar="NAME", help="The noisy tenant; default: the last --tenant.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=2,
    help="Each quiet tenant's requests in flight (closed loop); the noisy one keeps 4x.",
)
@click.option(
    "--input-len",
    type=click.IntRange(min=1),
    default=128,
    help="Quiet tenants' prompt tokens; the noisy one's are 8x.",
)
@click.option(
    "--output-len",
    type=click.IntRange(min=1),
    default=32,
    help="Tokens every request generates (ignore_eos: equal for every tenant).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    help="Seconds of each phase (each tenant alone, then all together) after which no request "
    "starts.",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=1000,
    help="Most requests a tenant sends in one phase.",
)
@click.option("--model", help="Model name to request; default: the first target's first model.")
@ENDPOINT
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    help="Seconds one request may take, stream included.",
)
@click.option(
    "--peer",
    type=click.Choice(["vllm"]),
    help="Also start plain vLLM's server on loopback with --config's model and engine "
    "arguments (target vllm-serve).",
)
@CONFIG
@click.option(
    "--baseline",
    metavar="TARGET",
    help="Target the single-tenant overhead is taken against; default: the first target.",
)
@click.option(
    "--merge",
    "merge_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="An earlier `bench tenants` report folder of the same workload (e.g. the platform "
    "without tenants): its targets join the comparison.",
)
@click.option(
    "--require",
    "requirements",
    multiple=True,
    metavar="EXPR",
    help="Gate, e.g. 'tenants.jain>=0.9' or 'tenants.ttft_p99_ratio@quiet<=1.5' "
    "([TARGET.]METRIC[@TENANT] OP N); exit 3 when a figure misses it.",
)
@click.option("--seed", type=int, default=0)
@OUTPUT
@bench_errors
def tenants(output_dir: str | None, **given: Any) -> None:
    """Quiet tenants and a noisy one (8x the prompt, 4x the concurrency) on each target: each
    alone, then together. Served tokens per tenant, Jain's fairness index, TTFT p50/p99 against
    alone, the single-tenant overhead against --baseline."""
    from serving.loadgen.scenarios.tenants import TenantsArgs, run_tenants

    finish("tenants", output_dir, lambda out: run_tenants(TenantsArgs(**given), out))

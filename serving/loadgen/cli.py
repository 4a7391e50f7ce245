"""`llm-serving bench`: load one or more OpenAI-compatible targets the same way, interleaved, and
write result.json, summary.md and plots. Bad input is one `error:` line and exit 2; an unusable
target exit 1; a missed `--require` exit 3 (after the report is written). Only click is imported
here: the load generator loads when the command runs, so other `llm-serving` commands stay quick."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from serving.loadgen.server_stats import STATS_INTERVAL_S

EXIT_TARGET, EXIT_USAGE, EXIT_REQUIRE = 1, 2, 3


def bench_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures print one `error: ...` line and exit non-zero instead of a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from serving.config import ConfigError
        from serving.loadgen import bench, metrics, require, workloads
        from serving.loadgen.client import TargetError
        from serving.loadgen.peers import PeerError
        from serving.models import ModelNotFoundError

        usage = (
            bench.UsageError,
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


@click.command()
@click.option(
    "--target",
    "target_items",
    multiple=True,
    metavar="NAME=URL[#MODEL]",
    help="An OpenAI base URL to load, e.g. vllm=http://127.0.0.1:8000/v1 (repeatable; "
    "the first is the subject of every ratio); #MODEL asks that target for MODEL (two "
    "models of one endpoint side by side). Default: the local platform.",
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    type=click.Choice(["vllm", "ray-serve-llm"]),
    help="Also start a peer on loopback and compare (same model and engine arguments as "
    "--config): vllm = plain vLLM's OpenAI server; ray-serve-llm = Ray Serve's LLM app, "
    "deployed into the running platform under /ray-llm.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Platform config YAML the peer copies its engine arguments from.",
)
@click.option("--model", help="Model name to request; default: the first target's first model.")
@click.option(
    "--model-mix",
    metavar="NAME=WEIGHT,...",
    help="Spread requests over models and adapters by weight (e.g. base=2,lora-a=1); "
    "the report breaks figures down per model.",
)
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
)
@click.option(
    "--scenario",
    type=click.Choice(["sweep", "poisson", "burst", "autoscale", "soak"]),
    default="sweep",
    show_default=True,
    help="sweep: closed loop at each concurrency; poisson: gamma "
    "arrivals at each --rate; burst: --rate for half the requests, then the rest at once; "
    "autoscale: a step of --concurrency in flight until a second replica serves, then "
    "the scale-down (one --target; times, timeline.png); soak: a closed loop at the "
    "largest --concurrency for --duration s while every replica's memory is sampled "
    "(one --target on the local platform; memory.png; exit 3 on growth or a failed "
    "request).",
)
@click.option(
    "--concurrency",
    default="1,2,4,8",
    show_default=True,
    help="sweep: the levels; poisson/burst: the most requests in flight (the largest).",
)
@click.option(
    "--requests",
    "num_requests",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Requests per target and level.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=math.inf,
    show_default=False,
    help="Seconds per target and level after which no request starts (default: none).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 100),
    default=2,
    show_default=True,
    help="Interleaving rounds per level (A B A B); fewer if a round could not fill "
    "the concurrency.",
)
@click.option("--rate", default="1", show_default=True, help="Requests/s (comma list for poisson).")
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Gamma shape of inter-arrival times: 1 Poisson, <1 burstier, >1 more even.",
)
@click.option(
    "--prompts",
    default="synthetic",
    show_default=True,
    help="synthetic, seed (the seed's questions), multi-turn (conversations resending "
    "their history, --turns each, turns in order; --input-len per question), "
    "shared-prefix (one --prefix-len system prompt, then --input-len distinct), or a "
    'JSONL file of {"prompt": ...}.',
)
@click.option(
    "--turns",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="multi-turn: turns per conversation (--requests in all).",
)
@click.option(
    "--prefix-len",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="shared-prefix: tokens of the shared system prompt.",
)
@click.option(
    "--context-len",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="multi-turn: tokens of each conversation's own opening system message (the "
    "document it is about).",
)
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--range-ratio",
    type=float,
    default=0.0,
    show_default=True,
    help="Synthetic lengths are drawn from len*(1 +/- ratio).",
)
@click.option(
    "--tokenizer",
    "tokenizer_ref",
    help="Model ref whose tokenizer sizes synthetic prompts exactly (default: ~1 word = 1 token).",
)
@click.option(
    "--free-length",
    is_flag=True,
    help="Let the model stop at EOS (default: ignore_eos + min_tokens, equal work).",
)
@click.option("--slo", help="Goodput SLOs in ms, e.g. ttft:500,tpot:50 (also e2el).")
@click.option(
    "--output",
    "output_dir",
    type=click.Path(file_okay=False),
    help="Report folder; default bench-results/DATE.",
)
@click.option(
    "--require",
    "requirements",
    multiple=True,
    metavar="EXPR",
    help="Gate, e.g. 'output_throughput_ratio>=3' or 'hf.output_throughput_ratio@c8>=3'; "
    "exit 3 when a figure misses it.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds one request may take, stream included.",
)
@click.option(
    "--stats-interval",
    type=click.FloatRange(min=0.005),
    default=STATS_INTERVAL_S,
    show_default=True,
    help="Seconds between reads of the server's running/waiting counts (each read is "
    "a request the target serves: keep it rare).",
)
@click.option(
    "--dashboard",
    metavar="URL",
    help="autoscale, soak: the Ray dashboard whose REST API lists the target's replicas "
    "(default: the local platform's; soak: on this machine).",
)
@click.option(
    "--max-growth-mb",
    type=click.FloatRange(min=0),
    default=200.0,
    show_default=True,
    help="soak: most a replica's memory may grow from the end of warm-up to the end.",
)
@click.option(
    "--warmup",
    type=click.FloatRange(min=0),
    default=None,
    help="soak: seconds before memory is compared (default: a quarter, at most 120).",
)
@click.option(
    "--suite",
    type=click.Choice(["seed"]),
    help="Run a suite instead of loading targets: seed = the study's experiments "
    "in-process on --config's model (generate() vs vLLM, KV cache, batching, waste; "
    "--output-len new tokens, --repeats; seed.md, seed.png).",
)
@click.option(
    "--batch-sizes",
    default="4,32,64",
    show_default=True,
    help="seed suite: the batch sizes of the efficiency experiment.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="seed suite: timed runs per figure (the median is reported).",
)
@bench_errors
def bench(**options: Any) -> None:
    """Benchmark OpenAI-compatible targets side by side (vLLM `bench serve` metrics)."""
    from serving.loadgen.bench import BenchArgs, run_bench

    suite_options = {k: options.pop(k) for k in ("suite", "batch_sizes", "repeats")}
    if suite_options["suite"] == "seed":
        from serving.loadgen.seed_report import run_seed_command

        run_seed_command(options, suite_options["batch_sizes"], suite_options["repeats"])
        return
    dashboard = options.pop("dashboard")
    soak_options = {
        "max_growth_mb": options.pop("max_growth_mb"),
        "warmup_s": options.pop("warmup"),
    }
    if options["scenario"] == "soak":
        from serving.loadgen.soak import run_soak

        if not run_soak(BenchArgs(**options), dashboard=dashboard, **soak_options):
            sys.exit(EXIT_REQUIRE)
        return
    if options["scenario"] == "autoscale":
        from serving.loadgen.autoscale import run_command

        run_command(BenchArgs(**options), dashboard)
        return
    if not run_bench(BenchArgs(**options)):
        sys.exit(EXIT_REQUIRE)

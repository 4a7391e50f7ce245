"""The click options the `llm-serving bench` scenarios share, each defined once (only click and
the stats interval are imported, so `llm-serving` starts quickly)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce
from typing import Any

import click

from serving.loadgen.server_stats import STATS_INTERVAL_S

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def options(*decorators: Decorator) -> Decorator:
    """Several click options as one decorator, in the order given."""
    return lambda func: reduce(lambda f, d: d(f), reversed(decorators), func)


TARGETS = click.option(
    "--target",
    "target_items",
    multiple=True,
    metavar="NAME=URL[#MODEL]",
    help="An OpenAI base URL to load, e.g. vllm=http://127.0.0.1:8000/v1 (repeatable; "
    "the first is the subject of every ratio); #MODEL asks that target for MODEL (two "
    "models of one endpoint side by side). Default: the local platform.",
)
ONE_TARGET = click.option(
    "--target",
    "target_items",
    multiple=True,  # given twice is an error line, not the last one silently winning
    metavar="NAME=URL",
    help="The one OpenAI base URL to load, e.g. auto=http://127.0.0.1:8000/autoscale/v1. "
    "Default: the local platform.",
)
CONFIG = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Platform config YAML (model and engine arguments; peers copy them).",
)
OUTPUT = click.option(
    "--output",
    "output_dir",
    type=click.Path(file_okay=False),
    help="Report folder; default bench-results/SCENARIO-DATE.",
)
DASHBOARD = click.option(
    "--dashboard",
    metavar="URL",
    help="The Ray dashboard whose REST API lists the target's replicas (default: the local "
    "platform's).",
)
STATS_INTERVAL = click.option(
    "--stats-interval",
    type=click.FloatRange(min=0.005),
    default=STATS_INTERVAL_S,
    help="Seconds between reads of the server's running/waiting counts (each read is "
    "a request the target serves: keep it rare).",
)
STEP_CONCURRENCY = click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    help="Requests kept in flight.",
)
ENDPOINT = click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
)
ROUNDS = click.option(
    "--rounds",
    type=click.IntRange(1, 100),
    default=2,
    help="Interleaving rounds per level (A B A B); fewer if a round could not fill the concurrency.",
)
LOAD = options(
    click.option("--model", help="Model name to request; default: the first target's first model."),
    ENDPOINT,
    click.option(
        "--request-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=300.0,
        help="Seconds one request may take, stream included.",
    ),
    click.option(
        "--free-length",
        is_flag=True,
        help="Let the model stop at EOS (default: ignore_eos + min_tokens, equal work).",
    ),
    click.option(
        "--requests",
        "num_requests",
        type=click.IntRange(min=1),
        default=32,
        help="Requests per target and level (autoscale: the most the step sends; soak: the "
        "prompts it cycles through).",
    ),
    click.option(
        "--prompts",
        default="synthetic",
        help="synthetic, seed (the seed's questions), multi-turn (conversations resending "
        "their history, --turns each, turns in order; --input-len per question), "
        "shared-prefix (one --prefix-len system prompt, then --input-len distinct), or a "
        'JSONL file of {"prompt": ...}.',
    ),
    click.option(
        "--turns",
        type=click.IntRange(min=1),
        default=5,
        help="multi-turn: turns per conversation (--requests in all).",
    ),
    click.option(
        "--prefix-len",
        type=click.IntRange(min=1),
        default=512,
        help="shared-prefix: tokens of the shared system prompt.",
    ),
    click.option(
        "--context-len",
        type=click.IntRange(min=0),
        default=0,
        help="multi-turn: tokens of each conversation's own opening system message (the "
        "document it is about).",
    ),
    click.option("--input-len", type=click.IntRange(min=1), default=128),
    click.option("--output-len", type=click.IntRange(min=1), default=64),
    click.option(
        "--range-ratio",
        type=float,
        default=0.0,
        help="Synthetic lengths are drawn from len*(1 +/- ratio).",
    ),
    click.option(
        "--tokenizer",
        "tokenizer_ref",
        help="Model ref whose tokenizer sizes synthetic prompts exactly (default: ~1 word = 1 "
        "token).",
    ),
    click.option(
        "--model-mix",
        metavar="NAME=WEIGHT,...",
        help="Spread requests over models and adapters by weight (e.g. base=2,lora-a=1); "
        "the report breaks figures down per model.",
    ),
    click.option("--seed", type=int, default=0),
)


def duration_option(help_text: str, required: bool = False) -> Decorator:
    """--duration in seconds: required, or unbounded unless given."""
    seconds = click.FloatRange(min=0, min_open=True)
    if required:
        return click.option("--duration", type=seconds, required=True, help=help_text)
    return click.option(
        "--duration", type=seconds, default=math.inf, show_default=False, help=help_text
    )

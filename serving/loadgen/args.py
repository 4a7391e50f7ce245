"""The inputs every load scenario of `llm-serving bench` shares: the options as dataclasses (one
per scenario, the fields are the subcommand's options), the targets and the requests built from
them. Bad input raises UsageError, whose message names the option."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, cast

from serving.loadgen import workloads
from serving.loadgen.client import Target, TargetError, served_models

TARGET_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class UsageError(ValueError):
    """Bad command-line input; the message names the option."""


@dataclass(frozen=True)
class LoadArgs:
    """What to send and where: the options of every load scenario."""

    target_items: tuple[str, ...]
    model: str | None
    endpoint: str
    request_timeout: float
    free_length: bool
    num_requests: int
    prompts: str
    turns: int
    prefix_len: int
    context_len: int
    input_len: int
    output_len: int
    range_ratio: float
    tokenizer_ref: str | None
    model_mix: str | None
    seed: int


@dataclass(frozen=True)
class StepArgs(LoadArgs):
    """`bench autoscale` and `bench soak`: one target, a fixed number of requests in flight."""

    concurrency: int
    duration: float
    dashboard: str | None


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
    from serving.local.platform import load_state

    state = load_state()
    if state is None:
        raise UsageError("no --target given and no local platform is running")
    return [Target("platform", state.api_url)]


def targets_of(args: LoadArgs) -> list[Target]:
    return parse_targets(args.target_items) if args.target_items else default_targets()


def one_target(args: StepArgs, scenario: str) -> Target:
    targets = targets_of(args)
    if len(targets) != 1:
        raise UsageError(f"bench {scenario} loads one --target")
    return targets[0]


def parse_list(text: str, kind: type, option: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(v <= 0 or not math.isfinite(v) for v in values):
        raise UsageError(f"{option} {text!r}: values must be positive")
    return values


def load_tokenizer(ref: str | None) -> workloads.Tokenizer | None:
    if ref is None:
        return None
    from transformers import AutoTokenizer

    from serving.models import resolve_model

    # A transformers tokenizer has the protocol's encode, and decodes one id list to one str.
    return cast(workloads.Tokenizer, AutoTokenizer.from_pretrained(str(resolve_model(ref))))


def build_requests(args: LoadArgs) -> list[workloads.RequestSpec]:
    specs = prompt_requests(args)
    if args.model_mix:
        specs = workloads.assign_models(specs, workloads.parse_model_mix(args.model_mix), args.seed)
    return specs


def prompt_requests(args: LoadArgs) -> list[workloads.RequestSpec]:
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

"""What to send and when: prompt sources (synthetic, the seed's prompts, JSONL) and load levels
(closed-loop concurrency sweep, Poisson/gamma arrivals, a step burst). Everything is deterministic
for a given seed, so every target of a comparison gets the same requests at the same offsets."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# Short, common English words: with SmolLM2/Qwen2-style BPE tokenizers almost every one is a single
# token with its leading space, so "N words" approximates "N tokens" without loading a tokenizer.
WORDS = (
    "the of and to in is was for on that with as by at from his her are this be it an which or "
    "had not but were have they one their all has been more when there who will time would its "
    "after first two new other year can only into may some also most over city state people world "
    "made many during later before under such part school work house game team same well three "
    "long day name found water small book light group music river line story power high market"
).split()

# Short chat-style questions like the seed's batching experiment (4 prompts, one by one vs batched).
SEED_PROMPTS = (
    "What is the capital of France?",
    "Explain in one paragraph why a KV cache speeds up text generation.",
    "Write a short poem about the ocean.",
    "Name three primary colors and describe each one.",
)


class WorkloadError(ValueError):
    """A workload that cannot be built (empty prompt file, bad length); the message says why."""


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class RequestSpec:
    prompt: str
    output_len: int
    input_len: int | None = None  # the generator's target; the server's usage count is reported
    model: str | None = None  # `--model-mix`: the model this request asks for; None: `--model`
    # Chat workloads: the messages sent to /chat/completions (`prompt` is their text, for
    # /completions); a conversation's turns go out one after another, each after the last answer.
    messages: tuple[dict[str, str], ...] | None = None
    conversation: int | None = None
    session: str | None = None  # sent as the OpenAI `user` field (session routing reads it)


@dataclass(frozen=True)
class LoadLevel:
    """One load level of a run: how many requests, and either a concurrency cap (closed loop:
    a new request starts when one finishes) or arrival offsets (open loop)."""

    label: str  # "c4", "r2", "burst": used in reports and `--require NAME@LABEL`
    num_requests: int
    concurrency: int | None = None  # most requests in flight; None = unbounded
    arrivals: tuple[float, ...] | None = None  # seconds from the level's start; None = at once
    rate: float | None = None
    burstiness: float | None = None


def sweep_levels(concurrencies: list[int], num_requests: int) -> list[LoadLevel]:
    return [LoadLevel(f"c{c}", num_requests, concurrency=c) for c in concurrencies]


def gamma_arrivals(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Arrival offsets whose gaps follow a gamma distribution with mean 1/rate, as vLLM's bench
    does: burstiness 1 is a Poisson process, <1 burstier, >1 more even."""
    if rate <= 0 or burstiness <= 0:
        raise WorkloadError("rate and burstiness must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num)
    offsets = np.cumsum(gaps) - gaps[0]  # the first request goes out at once
    return [float(x) for x in offsets]


def poisson_levels(
    rates: list[float], num_requests: int, burstiness: float, seed: int, max_concurrency: int | None
) -> list[LoadLevel]:
    return [
        LoadLevel(
            f"r{rate:g}",
            num_requests,
            concurrency=max_concurrency,
            arrivals=tuple(gamma_arrivals(num_requests, rate, burstiness, seed)),
            rate=rate,
            burstiness=burstiness,
        )
        for rate in rates
    ]


def step_burst_arrivals(num: int, rate: float, burst_fraction: float = 0.5) -> list[float]:
    """A quiet phase at an even `rate`, then the rest of the requests all at once: the step an
    autoscaler has to answer."""
    if rate <= 0 or not 0 < burst_fraction <= 1:
        raise WorkloadError("burst needs rate > 0 and 0 < burst fraction <= 1")
    quiet = num - math.ceil(num * burst_fraction)
    offsets = [i / rate for i in range(quiet)]
    burst_at = quiet / rate
    return offsets + [burst_at] * (num - quiet)


def burst_level(num_requests: int, rate: float, max_concurrency: int | None) -> LoadLevel:
    arrivals = tuple(step_burst_arrivals(num_requests, rate))
    return LoadLevel(
        "burst", num_requests, concurrency=max_concurrency, arrivals=arrivals, rate=rate
    )


def rounds_for(level: LoadLevel, rounds: int) -> int:
    """Interleaving rounds a level can take: a closed-loop chunk must still fill its concurrency."""
    if level.arrivals is None and level.concurrency:
        rounds = min(rounds, level.num_requests // level.concurrency)
    return max(1, min(rounds, level.num_requests))


def split_level(level: LoadLevel, rounds: int) -> list[LoadLevel]:
    """Cut a level into `rounds` consecutive chunks (A B A B interleaving); arrival offsets of
    each chunk restart at zero."""
    bounds = np.linspace(0, level.num_requests, rounds + 1).round().astype(int)
    chunks = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        arrivals = None
        if level.arrivals is not None:
            part = level.arrivals[start:stop]
            arrivals = tuple(t - part[0] for t in part)
        chunks.append(replace(level, num_requests=int(stop - start), arrivals=arrivals))
    return chunks


def _length(rng: np.random.Generator, mean: int, range_ratio: float) -> int:
    low = max(1, math.floor(mean * (1 - range_ratio)))
    high = max(low, math.ceil(mean * (1 + range_ratio)))
    return int(rng.integers(low, high + 1))


def synthetic_text(rng: np.random.Generator, num_tokens: int, tokenizer: Tokenizer | None) -> str:
    words = " ".join(rng.choice(WORDS, size=num_tokens))
    if tokenizer is None:
        return words
    ids = tokenizer.encode(words, add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids)


def synthetic_requests(
    num: int,
    input_len: int,
    output_len: int,
    seed: int,
    range_ratio: float = 0.0,
    tokenizer: Tokenizer | None = None,
) -> list[RequestSpec]:
    """Random-word prompts with input/output lengths drawn uniformly from mean*(1 +/- ratio)."""
    if input_len < 1 or output_len < 1:
        raise WorkloadError("input and output lengths must be at least 1")
    if not 0 <= range_ratio < 1:
        raise WorkloadError("length range ratio must be in [0, 1)")
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(num):
        n_in, n_out = _length(rng, input_len, range_ratio), _length(rng, output_len, range_ratio)
        specs.append(RequestSpec(synthetic_text(rng, n_in, tokenizer), n_out, n_in))
    return specs


def messages_text(messages: tuple[dict[str, str], ...]) -> str:
    """A chat's text for /completions: the turns one after another, as a template would."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def chat_request(
    messages: list[dict[str, str]],
    output_len: int,
    input_len: int | None = None,
    conversation: int | None = None,
) -> RequestSpec:
    session = None if conversation is None else f"conversation-{conversation}"
    turns = tuple(messages)
    return RequestSpec(
        messages_text(turns),
        output_len,
        input_len,
        messages=turns,
        conversation=conversation,
        session=session,
    )


def multi_turn_requests(
    num: int,
    turns: int,
    input_len: int,
    output_len: int,
    seed: int,
    tokenizer: Tokenizer | None = None,
    context_len: int = 0,
) -> list[RequestSpec]:
    """Conversations of `turns` turns (ceil(num / turns) of them, `num` requests in all): each
    turn resends the whole history, as chat clients do, with a fixed stand-in for the model's
    earlier answers (so every target gets the same prompts), and asks a new `input_len`-token
    question; with `context_len`, each conversation opens with its own system message of that
    many tokens (the document it is about). Turn k+1 goes out after turn k's answer."""
    if turns < 1 or input_len < 1 or output_len < 1 or context_len < 0:
        raise WorkloadError("turns, input and output lengths must be at least 1")
    rng = np.random.default_rng(seed)
    specs: list[RequestSpec] = []
    for conversation in range(math.ceil(num / turns)):
        history: list[dict[str, str]] = []
        if context_len:
            history.append(
                {"role": "system", "content": synthetic_text(rng, context_len, tokenizer)}
            )
        for _ in range(turns):
            question = synthetic_text(rng, input_len, tokenizer)
            history.append({"role": "user", "content": question})
            specs.append(chat_request(history, output_len, None, conversation))
            history.append(
                {"role": "assistant", "content": synthetic_text(rng, output_len, tokenizer)}
            )
    return specs[:num]


def shared_prefix_requests(
    num: int,
    prefix_len: int,
    input_len: int,
    output_len: int,
    seed: int,
    tokenizer: Tokenizer | None = None,
) -> list[RequestSpec]:
    """One `prefix_len`-token system prompt shared by every request, then a distinct
    `input_len`-token question: the case prefix caching (and routing to it) exists for."""
    if prefix_len < 1 or input_len < 1 or output_len < 1:
        raise WorkloadError("prefix, input and output lengths must be at least 1")
    rng = np.random.default_rng(seed)
    system = {"role": "system", "content": synthetic_text(rng, prefix_len, tokenizer)}
    return [
        chat_request(
            [system, {"role": "user", "content": synthetic_text(rng, input_len, tokenizer)}],
            output_len,
            prefix_len + input_len,
        )
        for _ in range(num)
    ]


def seed_requests(num: int, output_len: int) -> list[RequestSpec]:
    return [RequestSpec(SEED_PROMPTS[i % len(SEED_PROMPTS)], output_len) for i in range(num)]


def _jsonl_record(line: str, where: str, output_len: int) -> RequestSpec:
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{where}: not JSON ({err.msg})") from None
    prompt = record.get("prompt") if isinstance(record, dict) else None
    if not isinstance(prompt, str) or not prompt:
        raise WorkloadError(f"{where}: needs a non-empty string field 'prompt'")
    wanted = record.get("output_len", output_len)
    if not isinstance(wanted, int) or wanted < 1:
        raise WorkloadError(f"{where}: 'output_len' must be a positive integer")
    return RequestSpec(prompt, wanted)


def jsonl_requests(path: str | Path, num: int, output_len: int) -> list[RequestSpec]:
    """One JSON object a line: {"prompt": str, "output_len": int (optional)}; cycled to `num`."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise WorkloadError(f"cannot read prompt file {path}: {err.strerror}") from None
    specs = [
        _jsonl_record(line, f"{path}:{number}", output_len)
        for number, line in enumerate(lines, 1)
        if line.strip()
    ]
    if not specs:
        raise WorkloadError(f"prompt file {path} has no prompts")
    return [specs[i % len(specs)] for i in range(num)]


def parse_model_mix(text: str) -> dict[str, float]:
    """`--model-mix a=3,b=1`: each model's share of the requests (weights, normalised)."""
    mix: dict[str, float] = {}
    for item in text.split(","):
        name, sep, weight = item.strip().partition("=")
        try:
            value = float(weight) if sep else 1.0
        except ValueError:
            value = -1.0
        if not name or value <= 0 or name in mix:
            raise WorkloadError(
                f"--model-mix {text!r}: expected NAME=WEIGHT,... with distinct "
                "names and positive weights"
            )
        mix[name] = value
    return mix


def assign_models(specs: list[RequestSpec], mix: dict[str, float], seed: int) -> list[RequestSpec]:
    """Each request gets a model drawn by weight, the same draw on every target and round; a
    conversation's turns all go to its first turn's model."""
    rng = np.random.default_rng(seed)
    names = list(mix)
    weights = np.array([mix[name] for name in names]) / sum(mix.values())
    picks = rng.choice(len(names), size=len(specs), p=weights)
    first: dict[int, int] = {}
    for index, spec in enumerate(specs):
        if spec.conversation is not None:
            picks[index] = first.setdefault(spec.conversation, int(picks[index]))
    return [replace(spec, model=names[int(pick)]) for spec, pick in zip(specs, picks, strict=True)]

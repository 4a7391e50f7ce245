"""The HF baseline's per-request state and the pure sampling helpers every mode shares
(temperature, top_p/top_k/min_p, seed, penalties, stop strings, left padding), so a seeded request
gives the same tokens in every mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import (
    LogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from serving.engines.base import Delta, FinishReason, SamplingSpec, TokenLogprob

Emit = Callable[[Delta | BaseException], None]
# The min_p, top_k and top_p warpers read only the scores: they get no token ids (a long tensor).
NO_INPUT_IDS = cast(torch.LongTensor, torch.empty((1, 0), dtype=torch.long))


@dataclass
class Row:
    """One request inside the worker: its sampling state, its output so far, its way back."""

    request_id: str
    prompt_ids: list[int]
    spec: SamplingSpec
    mode: str
    emit: Emit  # thread-safe: hands a delta (or an error) to the request's event loop
    generator: torch.Generator | None = None
    arrived: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    text_sent: str = ""
    unsent_tokens: int = 0  # tokens whose text is still held back (partial UTF-8, maybe a stop)
    finish: FinishReason | None = None
    batch_size: int = 1
    held: Delta | None = None  # static-batch: the final delta waits for the whole batch
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)  # travel with unsent tokens
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # sent with the first delta

    @property
    def done(self) -> bool:
        return self.finish is not None or self.cancelled.is_set()


def take_delta(
    row: Row, text: str, finish: FinishReason | None = None, extra: dict[str, Any] | None = None
) -> Delta:
    """The row's next delta: new text plus the tokens (and logprobs) not sent yet."""
    asked = row.spec.logprobs is not None
    delta = Delta(
        text,
        row.unsent_tokens,
        finish,
        extra,
        logprobs=tuple(row.unsent_logprobs) if asked else None,
        prompt_logprobs=row.prompt_logprobs,
    )
    row.unsent_tokens, row.unsent_logprobs, row.prompt_logprobs = 0, [], None
    return delta


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


GREEDY_TEMPERATURE = 1e-5


def warped(warper: LogitsProcessor, logits: torch.Tensor) -> torch.Tensor:
    """One row's float logits through a transformers warper, as the batch of one it expects."""
    return warper(NO_INPUT_IDS, cast(torch.FloatTensor, logits[None]))[0]


def choose_token(logits: torch.Tensor, row: Row, eos_ids: list[int]) -> int:
    """Next token of one row from its last-position logits (OpenAI sampling semantics)."""
    spec = row.spec
    logits = logits.float().clone()
    if spec.repetition_penalty != 1.0:  # vLLM's: over the prompt and the output so far
        seen = torch.tensor([row.prompt_ids + row.output_ids], device=logits.device)
        logits = RepetitionPenaltyLogitsProcessor(spec.repetition_penalty)(seen, logits[None])[0]
    if row.output_ids and (spec.presence_penalty or spec.frequency_penalty):
        counts = torch.bincount(
            torch.tensor(row.output_ids, device=logits.device), minlength=logits.shape[-1]
        ).to(logits.dtype)
        logits -= spec.frequency_penalty * counts + spec.presence_penalty * (counts > 0)
    if len(row.output_ids) < spec.min_tokens and eos_ids:
        logits[eos_ids] = -float("inf")
    # Greedy below vLLM's _SAMPLING_EPS, as vLLM does: dividing by a tiny temperature
    # (e.g. 1e-300) overflows the logits to inf and the softmax to NaN.
    if spec.temperature < GREEDY_TEMPERATURE:
        return int(logits.argmax())
    logits = logits / spec.temperature
    # The order of vLLM's sampler: temperature, min_p, then top_k and top_p.
    if spec.min_p > 0.0:
        logits = warped(MinPLogitsWarper(spec.min_p), logits)
    if spec.top_k > 0:
        logits = warped(TopKLogitsWarper(spec.top_k), logits)
    if spec.top_p < 1.0:
        logits = warped(TopPLogitsWarper(spec.top_p), logits)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=row.generator))


def find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Index where the earliest stop string begins at or after `start`, else None."""
    hits = [i for i in (text.find(stop, start) for stop in stops if stop) if i >= 0]
    return min(hits) if hits else None


def row_timings(row: Row) -> dict[str, Any]:
    times = row.token_times
    return {
        "mode": row.mode,
        "batch_size": row.batch_size,
        "queue_ms": round((row.started - row.arrived) * 1000, 3),
        "ttft_ms": round((times[0] - row.arrived) * 1000, 3) if times else None,
        "itl_ms": [round((b - a) * 1000, 3) for a, b in zip(times, times[1:])],
    }


def left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder-only batches pad on the left so every row's next token sits at the last position."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[i, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)

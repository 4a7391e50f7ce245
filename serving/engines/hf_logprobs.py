"""Logprobs of the HF baseline, computed as vLLM computes them by default (`logprobs_mode` =
"raw_logprobs"): float32 log-softmax of the model's raw logits, before temperature, penalties or
any other processing, so the two engines' numbers can be compared position by position."""

from __future__ import annotations

from typing import Any

import torch

from serving.engines.base import TokenLogprob


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def top_entries(logprobs: torch.Tensor, k: int) -> tuple[tuple[int, float], ...]:
    """The k most likely tokens of one position, best first."""
    if k <= 0:
        return ()
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]))
    return tuple(zip(ids.tolist(), values.tolist()))


def token_logprob(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """The chosen token's raw logprob and the top k, from one position's logits."""
    logprobs = raw_logprobs(logits)
    return TokenLogprob(token_id, float(logprobs[token_id]), top_entries(logprobs, k))


def prompt_logprobs(
    model: Any, prompt_ids: list[int], k: int, device: torch.device
) -> tuple[TokenLogprob | None, ...]:
    """Each prompt token's logprob given the tokens before it (one extra forward pass over the
    prompt); the first is None: nothing predicts it."""
    ids = torch.tensor([prompt_ids], device=device)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
    entries: list[TokenLogprob | None] = [None]
    for position, token in enumerate(prompt_ids[1:]):
        logprobs = raw_logprobs(logits[position])
        entries.append(TokenLogprob(token, float(logprobs[token]), top_entries(logprobs, k)))
    return tuple(entries)

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
    return scored(logits, token_id, k)


# Prompt positions per forward pass: full-vocabulary float32 logits of a long prompt at once
# would not fit (32k tokens x 152k vocabulary = 20 GB); 512 of them take ~0.3 GB.
PROMPT_CHUNK = 512


def prompt_logprobs(
    model: Any, prompt_ids: list[int], k: int, device: torch.device, chunk: int = PROMPT_CHUNK
) -> tuple[TokenLogprob | None, ...]:
    """Each prompt token's logprob given the tokens before it (one extra prefill over the
    prompt, in chunks over a KV cache); the first is None: nothing predicts it."""
    entries: list[TokenLogprob | None] = [None]
    cache = None
    last = len(prompt_ids) - 1  # the last token predicts the output, not the prompt
    for start in range(0, last, chunk):
        ids = torch.tensor([prompt_ids[start : min(start + chunk, last)]], device=device)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        for offset, row in enumerate(out.logits[0]):  # row predicts the token after its own
            entries.append(scored(row, prompt_ids[start + offset + 1], k))
    return tuple(entries)


def scored(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    logprobs = raw_logprobs(logits)
    return TokenLogprob(token_id, float(logprobs[token_id]), top_entries(logprobs, k))

"""Per-token latency of greedy decoding with and without the KV cache. Without it every step
re-runs the whole sequence (step cost grows with length: quadratic total); with it a step feeds one
token against cached keys/values (nearly flat per step: linear total). A least-squares line over
the decode steps turns the claim into a number: ms per token of context."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from serving.analysis import AnalysisInputError
from serving.analysis.attention import encode_prompt

MODES = ("no-cache", "kv-cache")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise AnalysisInputError(
            f"unknown mode '{mode}'; allowed: {', '.join(MODES)}", param="mode"
        )


def check_new_tokens(max_new_tokens: int, limit: int | None) -> None:
    if max_new_tokens <= 0:
        raise AnalysisInputError(
            f"max_new_tokens must be positive, got {max_new_tokens}", param="max_new_tokens"
        )
    if limit is not None and max_new_tokens > limit:
        raise AnalysisInputError(
            f"max_new_tokens={max_new_tokens} is over the limit max_new_tokens={limit}",
            param="max_new_tokens",
            code="max_new_tokens_too_large",
        )


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """[1, 1] id of the most likely next token."""
    return logits[:, -1, :].argmax(dim=-1, keepdim=True)


@torch.inference_mode()
def trace_no_cache(
    model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int
) -> tuple[list[float], list[int]]:
    """Each step re-encodes prompt + everything generated so far."""
    ids, latencies, generated = input_ids, [], []
    for _ in range(max_new_tokens):
        started = time.perf_counter()
        logits = model(ids, use_cache=False, logits_to_keep=1).logits
        token = greedy_token(logits)
        latencies.append((time.perf_counter() - started) * 1000)
        generated.append(int(token))
        ids = torch.cat([ids, token], dim=1)
    return latencies, generated


@torch.inference_mode()
def trace_kv_cache(
    model: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int
) -> tuple[list[float], list[int]]:
    """Step 0 is the prefill of the prompt; later steps feed only the last token."""
    feed, past, latencies, generated = input_ids, None, [], []
    for _ in range(max_new_tokens):
        started = time.perf_counter()
        out = model(feed, past_key_values=past, use_cache=True, logits_to_keep=1)
        token = greedy_token(out.logits)
        latencies.append((time.perf_counter() - started) * 1000)
        generated.append(int(token))
        feed, past = token, out.past_key_values
    return latencies, generated


def fit_growth(context_lengths: list[int], latencies_ms: list[float]) -> dict[str, Any]:
    """Least-squares line latency = intercept + slope x context length; slope None for < 2 points."""
    if len(latencies_ms) < 2:
        return {"slope_ms_per_token": None, "intercept_ms": None, "points": len(latencies_ms)}
    slope, intercept = statistics.linear_regression(context_lengths, latencies_ms)
    return {"slope_ms_per_token": slope, "intercept_ms": intercept, "points": len(latencies_ms)}


@torch.inference_mode()
def warm_up(model: PreTrainedModel, input_ids: torch.Tensor) -> None:
    # One untimed forward so one-off costs (allocator, lazy init) do not land on step 0.
    model(input_ids, use_cache=False, logits_to_keep=1)


def generation_trace(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    max_new_tokens: int,
    mode: str,
    max_prompt_tokens: int | None = None,
    max_new_tokens_limit: int | None = None,
) -> dict[str, Any]:
    """Greedy decode `max_new_tokens` (EOS ignored, so every trace has that many points) and
    time each step; the growth fit covers the decode steps after the first token."""
    check_mode(mode)
    check_new_tokens(max_new_tokens, max_new_tokens_limit)
    input_ids = encode_prompt(tokenizer, prompt, max_prompt_tokens)
    warm_up(model, input_ids)
    run = trace_no_cache if mode == "no-cache" else trace_kv_cache
    latencies, generated = run(model, input_ids, max_new_tokens)
    prompt_len = input_ids.shape[1]
    # Step i attends over prompt_len + i tokens; step 0 (the prefill with a cache) is left out.
    context = [prompt_len + i for i in range(1, len(latencies))]
    decode = latencies[1:]
    return {
        "mode": mode,
        "prompt_tokens": prompt_len,
        "new_tokens": len(generated),
        "token_ids": generated,
        "text": tokenizer.decode(generated),
        "latencies_ms": [round(ms, 4) for ms in latencies],
        "first_token_ms": round(latencies[0], 4),
        "mean_decode_ms": round(statistics.fmean(decode), 4) if decode else None,
        "total_ms": round(sum(latencies), 4),
        "growth": fit_growth(context, decode),
    }

"""The transformers engine's logprobs on the tiny random Qwen2: the raw distribution (as vLLM's
default `logprobs_mode`), whatever the sampling; the same in every mode; prompt logprobs for echo."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from serving.config import PlatformConfig
from serving.engines.base import Delta, SamplingSpec
from serving.engines.hf import MODES, HFEngine
from serving.engines.hf_logprobs import prompt_logprobs
from serving.models import TINY_REF, resolve_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    config = PlatformConfig.model_validate(
        {"model": {"ref": TINY_REF, "dtype": "float32", "max_model_len": 1024}}
    )
    hf = HFEngine.load(config, resolve_model(TINY_REF))
    yield hf
    hf.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(engine: HFEngine) -> list[int]:
    return engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]


async def deltas(engine: HFEngine, prompt: list[int], **spec: Any) -> list[Delta]:
    spec = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True, **spec}
    return [d async for d in engine.generate("r", prompt, SamplingSpec(**spec))]


def reference_logprobs(engine: HFEngine, ids: list[int]) -> torch.Tensor:
    """log-softmax of one plain forward pass: row i scores the token after ids[i]."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


async def test_logprobs_are_the_raw_distribution_whatever_the_sampling(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    got = await deltas(
        engine, prompt_ids, temperature=0.7, seed=3, repetition_penalty=1.5, top_k=5, logprobs=3
    )
    entries = [entry for d in got for entry in d.logprobs]
    assert len(entries) == sum(d.num_tokens for d in got) == 4  # logprobs travel with tokens
    output = [entry.token_id for entry in entries]
    reference = reference_logprobs(engine, prompt_ids + output)
    for step, entry in enumerate(entries):
        row = reference[len(prompt_ids) - 1 + step]
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-5)
        assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()


@pytest.mark.parametrize("mode", MODES)
async def test_greedy_logprobs_agree_across_modes(
    engine: HFEngine, prompt_ids: list[int], mode: str
) -> None:
    reference = await deltas(engine, prompt_ids, logprobs=2, mode="kv-cache")
    got = await deltas(engine, prompt_ids, logprobs=2, mode=mode)
    want = [e for d in reference for e in d.logprobs]
    have = [e for d in got for e in d.logprobs]
    assert [e.token_id for e in have] == [e.token_id for e in want]
    assert [e.logprob for e in have] == pytest.approx([e.logprob for e in want], abs=1e-5)


async def test_prompt_logprobs_come_once_and_score_each_prompt_token(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    got = await deltas(engine, prompt_ids, max_tokens=3, prompt_logprobs=1)
    prompt = got[0].prompt_logprobs
    assert all(d.prompt_logprobs is None for d in got[1:])
    assert all(d.logprobs is None for d in got)  # not asked for
    assert prompt[0] is None and len(prompt) == len(prompt_ids)
    reference = reference_logprobs(engine, prompt_ids)
    for position, entry in enumerate(prompt[1:], start=1):
        assert entry.token_id == prompt_ids[position]
        assert entry.logprob == pytest.approx(
            float(reference[position - 1, entry.token_id]), abs=1e-5
        )
        assert len(entry.top) == 1


def test_prompt_logprobs_in_chunks_match_one_pass(engine: HFEngine, prompt_ids: list[int]) -> None:
    """Long prompts are scored a chunk at a time over a KV cache (bounded logits memory)."""
    with torch.inference_mode():
        whole = prompt_logprobs(engine.model, prompt_ids, 2, engine.device)
        chunked = prompt_logprobs(engine.model, prompt_ids, 2, engine.device, chunk=2)
    assert len(chunked) == len(whole) == len(prompt_ids) and chunked[0] is None
    for a, b in zip(whole[1:], chunked[1:]):
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]

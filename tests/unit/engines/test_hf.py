"""The transformers engine on the tiny random Qwen2, without Ray or HTTP: every mode, sampling,
stop strings, cancellation, timings and the static batcher."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from serving.config import PlatformConfig
from serving.engines.base import Delta, SamplingSpec
from serving.engines.hf import MODES, HFEngine
from serving.engines.hf_rows import Row, choose_token, find_stop
from serving.models import TINY_REF, resolve_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    config = PlatformConfig.model_validate(
        {
            "model": {"ref": TINY_REF, "dtype": "float32", "max_model_len": 1024},
            "hf": {"batch_window_ms": 300, "max_batch_size": 4},
        }
    )
    hf = HFEngine.load(config, resolve_model(TINY_REF))
    yield hf
    hf.shutdown()


@pytest.fixture(scope="module")
def prompt_ids(engine: HFEngine) -> list[int]:
    return engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]


@dataclass
class Result:
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    deltas: list[Delta] = field(default_factory=list)


async def run(engine: HFEngine, prompt: list[int], request_id: str = "r", **spec: Any) -> Result:
    spec = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **spec}
    result = Result()
    async for delta in engine.generate(request_id, prompt, SamplingSpec(**spec)):
        result.deltas.append(delta)
        result.text += delta.text
        result.num_tokens += delta.num_tokens
        result.finish_reason = delta.finish_reason
        result.extra.update(delta.extra or {})
    return result


async def wait_idle(engine: HFEngine, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if engine.stats().running == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine.stats()}")


def worker_row(**spec: Any) -> Row:
    """A greedy request as the worker sees it, with nobody listening."""
    return Row("r", [1], SamplingSpec(temperature=0.0, **spec), "kv-cache", emit=lambda _: None)


@pytest.mark.parametrize("mode", MODES)
async def test_each_mode_generates_max_tokens(
    engine: HFEngine, prompt_ids: list[int], mode: str
) -> None:
    result = await run(engine, prompt_ids, mode=mode, max_tokens=6)
    assert result.finish_reason == "length"
    assert result.num_tokens == 6
    assert result.text
    assert all(d.finish_reason is None for d in result.deltas[:-1])


async def test_greedy_agrees_across_modes(engine: HFEngine, prompt_ids: list[int]) -> None:
    texts = {mode: (await run(engine, prompt_ids, mode=mode, max_tokens=12)).text for mode in MODES}
    assert len(set(texts.values())) == 1, texts


async def test_seed_reproduces_a_sample_in_every_mode(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    sampled = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 12}
    first = await run(engine, prompt_ids, seed=7, **sampled)
    again = [(await run(engine, prompt_ids, seed=7, mode=m, **sampled)).text for m in MODES]
    other = await run(engine, prompt_ids, seed=8, **sampled)
    assert again == [first.text] * len(MODES)
    assert other.text != first.text


async def test_stop_string_cuts_the_text(engine: HFEngine, prompt_ids: list[int]) -> None:
    sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 24}
    full = (await run(engine, prompt_ids, **sampled)).text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = await run(engine, prompt_ids, stop=(stop,), **sampled)
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    assert cut.num_tokens < 24


async def test_end_of_sequence_stops_unless_ignored(engine: HFEngine) -> None:
    # The random model never picks EOS on its own: drive one step with EOS as the best logit.
    eos = engine.eos_ids[0]
    logits = torch.zeros(len(engine.tokenizer))
    logits[eos] = 10.0
    row = worker_row(max_tokens=5)
    assert engine.step(row, logits) == eos
    assert row.finish == "stop"
    kept = worker_row(max_tokens=5, ignore_eos=True)
    engine.step(kept, logits)
    assert kept.finish is None


def test_min_tokens_bans_eos_and_penalties_lower_repeats() -> None:
    logits = torch.tensor([0.0, 5.0, 4.0, 1.0])
    early = worker_row(max_tokens=4, min_tokens=2)
    assert choose_token(logits, early, eos_ids=[1]) == 2
    repeat = worker_row(max_tokens=4, frequency_penalty=2.0)
    repeat.output_ids = [1]
    assert choose_token(logits, repeat, eos_ids=[]) == 2


def test_find_stop_returns_the_earliest_match() -> None:
    assert find_stop("abc STOP x END", ("END", "STOP"), 0) == 4
    assert find_stop("abc", ("zz",), 0) is None


async def test_cancelling_the_stream_stops_generation(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    stream = engine.generate(
        "cancel-me",
        prompt_ids,
        SamplingSpec(max_tokens=600, temperature=0.0, ignore_eos=True, mode="no-cache"),
    )
    before = engine.tokens_generated
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    await wait_idle(engine)  # the worker notices within one step
    assert engine.tokens_generated - before < 50
    assert engine.stats().aborted_total >= 1
    after = await run(engine, prompt_ids, max_tokens=3)  # and the engine keeps serving
    assert after.num_tokens == 3


async def test_timings_only_when_asked(engine: HFEngine, prompt_ids: list[int]) -> None:
    plain = await run(engine, prompt_ids, max_tokens=5)
    timed = await run(engine, prompt_ids, max_tokens=5, timings=True, mode="kv-cache")
    assert plain.extra == {}
    timings = timed.extra["timings"]
    assert timings["mode"] == "kv-cache"
    assert timings["ttft_ms"] > 0
    assert len(timings["itl_ms"]) == 4 and all(gap > 0 for gap in timings["itl_ms"])


async def test_no_cache_steps_cost_more_than_cached_steps(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    # Compared within one run, on medians (a busy machine slows both alike): re-feeding the whole
    # sequence costs more per token than feeding one token with the cache. How the cost grows with
    # length is a benchmark figure, not a test threshold.
    long_prompt = (prompt_ids * 40)[:300]
    spec = {"max_tokens": 24, "timings": True}
    no_cache = await run(engine, long_prompt, mode="no-cache", **spec)
    kv_cache = await run(engine, long_prompt, mode="kv-cache", **spec)
    no_cache_gap = statistics.median(no_cache.extra["timings"]["itl_ms"])
    kv_cache_gap = statistics.median(kv_cache.extra["timings"]["itl_ms"])
    assert no_cache_gap > kv_cache_gap, (no_cache_gap, kv_cache_gap)


async def test_static_batch_answers_everyone_when_the_longest_ends(
    engine: HFEngine, prompt_ids: list[int]
) -> None:
    before = engine.tokens_generated
    generated_at_answer: dict[str, int] = {}

    async def tracked(name: str, prompt: list[int], max_tokens: int) -> Result:
        result = await run(
            engine,
            prompt,
            request_id=name,
            mode="static-batch",
            max_tokens=max_tokens,
            timings=True,
        )
        generated_at_answer[name] = engine.tokens_generated - before
        return result

    short, long_, other = await asyncio.gather(
        tracked("short", prompt_ids[:2], 2),
        tracked("long", prompt_ids, 40),
        tracked("other", prompt_ids[1:], 10),
    )
    assert [r.extra["timings"]["batch_size"] for r in (short, long_, other)] == [3, 3, 3]
    assert (short.num_tokens, long_.num_tokens, other.num_tokens) == (2, 40, 10)
    # the 2-token request is answered only once the whole batch (2 + 40 + 10 tokens) is done
    assert generated_at_answer["short"] == 52
    single = await run(engine, prompt_ids[1:], mode="generate", max_tokens=10)
    assert other.text == single.text  # left padding does not change a row's tokens


async def test_stats_count_queued_requests(engine: HFEngine, prompt_ids: list[int]) -> None:
    jobs = [
        asyncio.create_task(run(engine, prompt_ids, request_id=f"q{i}", max_tokens=30))
        for i in range(3)
    ]
    await asyncio.sleep(0.3)
    stats = engine.stats()
    assert stats.running == 1 and stats.waiting >= 1  # one job at a time: the rest wait
    await asyncio.gather(*jobs)
    await wait_idle(engine)
    assert engine.stats().waiting == 0


def test_the_engine_takes_the_model_sampling_defaults(tmp_path: Any) -> None:
    import json
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(resolve_model(TINY_REF), model_dir)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    generation.update({"temperature": 0.6, "top_k": 7, "max_new_tokens": 50})
    (model_dir / "generation_config.json").write_text(json.dumps(generation))
    config = PlatformConfig.model_validate({"model": {"ref": str(model_dir), "dtype": "float32"}})
    hf = HFEngine.load(config, model_dir)
    try:
        assert hf.sampling_defaults == {"temperature": 0.6, "top_k": 7}
    finally:
        hf.shutdown()

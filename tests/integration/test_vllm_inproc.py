"""The real vLLM V1 engine with its engine core in this process (`engine_core: inprocess`: a
replica starts without spawning one): streaming, batching, abort, a rejected request, start-up,
and a Serve replica running it answering as the default one does."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from serving.config import load_config, parse_config
from serving.deployments.vllm_server import build_vllm_app
from serving.engines.base import Delta, SamplingSpec
from serving.engines.vllm import VLLMEngine
from serving.engines.vllm_inproc import SWITCH_INTERVAL_S
from serving.models import resolve_model
from tests.integration.conftest import MODEL, Platform, extra_app

PREFIX = "/inproc"
GREEDY = SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[VLLMEngine]:
    config = parse_config({
        "model": {"ref": MODEL, "max_model_len": 256, "dtype": "float32"},
        # cpu_niceness None: an in-process engine would lower every thread of this test process
        # for good (tests/unit/test_cpu_priority.py covers it in a child interpreter).
        "vllm": {"engine": {"kv_cache_memory_gb": 0.1, "max_num_seqs": 8,
                            "engine_core": "inprocess", "cpu_niceness": None}},
    })
    import torch

    # vLLM's CPU worker changes process-wide state: the environment, the switch interval (ours)
    # and torch.set_num_threads (made a no-op); later tests in this process get theirs back.
    environ, switch_interval = dict(os.environ), sys.getswitchinterval()
    set_num_threads = torch.set_num_threads
    engine = VLLMEngine.start(config, resolve_model(config.model.ref, config.model.cache_dir))
    yield engine
    engine.shutdown()
    os.environ.clear()
    os.environ.update(environ)
    sys.setswitchinterval(switch_interval)
    torch.set_num_threads = set_num_threads


async def collect(engine: VLLMEngine, request_id: str, prompt: list[int],
                  sampling: SamplingSpec = GREEDY) -> list[Delta]:
    return [delta async for delta in engine.generate(request_id, prompt, sampling)]


async def test_a_request_streams_every_token_then_finishes(engine: VLLMEngine) -> None:
    deltas = await collect(engine, "one", [11, 12, 13, 14])
    assert sum(delta.num_tokens for delta in deltas) == 8
    assert deltas[-1].finish_reason == "length"
    assert all(delta.finish_reason is None for delta in deltas[:-1])
    assert "".join(delta.text for delta in deltas)


async def test_batched_requests_match_the_same_request_alone(engine: VLLMEngine) -> None:
    alone = await collect(engine, "alone", [21, 22, 23])
    batched = await asyncio.gather(*(collect(engine, f"b{i}", [21, 22, 23]) for i in range(4)))
    text = "".join(delta.text for delta in alone)
    assert ["".join(delta.text for delta in deltas) for deltas in batched] == [text] * 4


async def test_leaving_a_stream_aborts_it_and_the_engine_serves_on(engine: VLLMEngine) -> None:
    aborted_before = engine.stats().aborted_total
    long = SamplingSpec(max_tokens=200, temperature=0.0, ignore_eos=True)
    stream = engine.generate("leave", [31, 32], long)
    await anext(stream)
    await stream.aclose()
    for _ in range(100):  # the abort runs on the engine thread before its next step
        if engine.stats().running == 0:
            break
        await asyncio.sleep(0.05)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.aborted_total) == (0, 0, aborted_before + 1)
    assert sum(delta.num_tokens for delta in await collect(engine, "after", [33])) == 8


async def test_a_prompt_over_the_context_fails_alone(engine: VLLMEngine) -> None:
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="is longer than the maximum model length"):
        await collect(engine, "too-long", [5] * 300)
    await engine.check_health()
    assert sum(delta.num_tokens for delta in await collect(engine, "fine", [5] * 10)) == 8


def test_the_engine_core_runs_in_this_process(engine: VLLMEngine) -> None:
    assert type(engine.llm.engine.engine_core).__name__ == "InprocClient"
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert multiprocessing.active_children() == []  # no spawned engine-core process
    timings = engine.startup_timings
    assert {"import_vllm", "engine_core", "model_load", "kv_cache_profile_warmup"} <= set(timings)


def test_a_replica_with_the_engine_core_inprocess_answers_as_the_default_one(
    platform: Platform,
) -> None:
    """Through Ray Serve and the OpenAI client: same greedy answers as the platform's own vLLM
    app (engine core in a child process), streamed or not."""
    config = load_config(platform.config_path).model_dump(mode="json")
    config["vllm"]["route_prefix"] = PREFIX
    config["vllm"]["engine"]["engine_core"] = "inprocess"
    questions = ["What is the capital of France?", "Name three primary colors."]
    with extra_app("inproc", PREFIX, build_vllm_app(parse_config(config))):
        inproc = [greedy_answer(platform.client(PREFIX), q, stream) for q in questions
                  for stream in (False, True)]
        health = httpx.get(f"{platform.url}{PREFIX}/health", timeout=10).json()
    default = [greedy_answer(platform.client(), q, stream) for q in questions
               for stream in (False, True)]
    assert inproc == default
    assert all(text for text in inproc)
    assert (health["status"], health["running"], health["waiting"]) == ("ok", 0, 0), health
    assert "engine_core" in health["startup_s"], health


def greedy_answer(client: openai.OpenAI, question: str, stream: bool) -> str:
    request = {"model": MODEL, "max_tokens": 12, "temperature": 0.0,
               "messages": [{"role": "user", "content": question}]}
    if not stream:
        return client.chat.completions.create(**request).choices[0].message.content
    chunks = client.chat.completions.create(**request, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

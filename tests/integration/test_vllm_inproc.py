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
from serving.engines.vllm import VLLMEngine
from serving.engines.vllm_inproc import SWITCH_INTERVAL_S
from serving.models import resolve_model
from tests.integration.conftest import MODEL, Platform, extra_app

PREFIX = "/inproc"


def greedy(max_tokens: int = 8):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )


async def collect(engine: VLLMEngine, request_id: str, prompt: list[int], max_tokens: int = 8):
    from vllm.inputs.engine import tokens_input

    stream = engine.llm.generate(tokens_input(prompt), greedy(max_tokens), request_id)
    return [output.outputs[0] async for output in stream]


def text(outputs: list) -> str:
    return "".join(output.text for output in outputs)


@pytest.fixture
def restore_process_state() -> Iterator[None]:
    """vLLM's CPU worker changes process-wide state: the environment, the switch interval (ours)
    and torch.set_num_threads (made a no-op); later tests in this process get theirs back."""
    import torch

    environ, switch_interval = dict(os.environ), sys.getswitchinterval()
    set_num_threads = torch.set_num_threads
    yield
    os.environ.clear()
    os.environ.update(environ)
    sys.setswitchinterval(switch_interval)
    torch.set_num_threads = set_num_threads


async def test_the_inprocess_engine_core_streams_batches_aborts_and_rejects_alone(
    restore_process_state: None,
) -> None:
    """AsyncLLM over the threaded in-process core: the same engine client vLLM's app serves."""
    from vllm.exceptions import VLLMValidationError

    config = parse_config(
        {
            "model": {"ref": MODEL, "max_model_len": 256, "dtype": "float32"},
            # cpu_niceness None: an in-process engine would lower every thread of this test process
            # for good (tests/unit/engines/test_cpu_priority.py covers it in a child interpreter).
            "vllm": {
                "engine": {
                    "kv_cache_memory_gb": 0.1,
                    "max_num_seqs": 8,
                    "engine_core": "inprocess",
                    "cpu_niceness": None,
                }
            },
        }
    )
    engine = VLLMEngine.start(config, resolve_model(config.model.ref, config.model.cache_dir))
    try:
        assert type(engine.llm.engine_core).__name__ == "ThreadedCoreClient"
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert multiprocessing.active_children() == []  # no spawned engine-core process
        assert {"import_vllm", "engine_core", "model_load", "kv_cache_profile_warmup"} <= set(
            engine.startup_timings
        )

        one = await collect(engine, "one", [11, 12, 13, 14])
        assert sum(len(o.token_ids) for o in one) == 8 and one[-1].finish_reason == "length"

        alone = await collect(engine, "alone", [21, 22, 23])
        batched = await asyncio.gather(*(collect(engine, f"b{i}", [21, 22, 23]) for i in range(4)))
        assert [text(outputs) for outputs in batched] == [text(alone)] * 4

        aborted_before = engine.stats().aborted_total
        from vllm.inputs.engine import tokens_input

        stream = engine.llm.generate(tokens_input([31, 32]), greedy(200), "leave")
        await anext(stream)
        await stream.aclose()  # leaving the stream aborts the request in the engine
        for _ in range(100):
            if engine.stats().running == 0 and engine.stats().aborted_total > aborted_before:
                break
            await asyncio.sleep(0.05)
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.aborted_total) == (0, 0, aborted_before + 1)

        with pytest.raises(VLLMValidationError, match="longer than the maximum model length"):
            await collect(engine, "too-long", [5] * 300)
        await engine.check_health()
        assert sum(len(o.token_ids) for o in await collect(engine, "after", [5] * 10)) == 8
    finally:
        engine.shutdown()


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
        inproc = [
            greedy_answer(platform.client(PREFIX), q, stream)
            for q in questions
            for stream in (False, True)
        ]
        health = httpx.get(f"{platform.url}{PREFIX}/health", timeout=10).json()
    default = [
        greedy_answer(platform.client(), q, stream) for q in questions for stream in (False, True)
    ]
    assert inproc == default
    assert all(text for text in inproc)
    assert (health["status"], health["running"], health["waiting"]) == ("ok", 0, 0), health
    assert "engine_core" in health["startup_s"], health


def greedy_answer(client: openai.OpenAI, question: str, stream: bool) -> str:
    request = {
        "model": MODEL,
        "max_tokens": 12,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": question}],
    }
    if not stream:
        return client.chat.completions.create(**request).choices[0].message.content
    chunks = client.chat.completions.create(**request, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

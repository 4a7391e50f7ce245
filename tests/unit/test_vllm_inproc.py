"""The thread that drives an in-process vLLM engine: commands run between steps, outputs reach the
right stream, leaving a stream aborts its request, failures reach the callers. A scripted engine
stands in for vLLM's LLMEngine here (the real one: tests/integration/test_vllm_inproc.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest

from serving.engines.vllm_inproc import InprocLLM


@dataclass
class Output:
    request_id: str
    step: int
    finished: bool


@dataclass
class ScriptedEngine:
    """Each request runs for its `max_tokens` steps; records what the driver asked of it."""

    fail_at_step: int | None = None
    requests: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    steps: int = 0
    threads: set[str] = field(default_factory=set)
    shut_down: bool = False

    def __post_init__(self) -> None:
        self.engine_core = self
        self.tokenizer = "tokenizer"

    def add_request(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self.threads.add(threading.current_thread().name)
        if not prompt:
            raise ValueError("empty prompt")
        self.requests[request_id] = max_tokens

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[Output]:
        self.threads.add(threading.current_thread().name)
        time.sleep(0.001)  # a step takes time: commands queue up meanwhile
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("device lost")
        outputs = []
        for request_id in list(self.requests):
            self.requests[request_id] -= 1
            done = self.requests[request_id] == 0
            if done:
                del self.requests[request_id]
            outputs.append(Output(request_id, self.steps, done))
        return outputs

    def shutdown(self) -> None:
        self.shut_down = True


def start(engine: ScriptedEngine) -> InprocLLM:
    return InprocLLM.start(lambda: engine)


async def collect(llm: InprocLLM, request_id: str, prompt: list[int], steps: int) -> list[Output]:
    return [output async for output in llm.generate(prompt, steps, request_id)]


def test_concurrent_requests_stream_their_own_outputs_on_the_engine_thread() -> None:
    engine = ScriptedEngine()
    llm = start(engine)

    async def main() -> list[list[Output]]:
        return await asyncio.gather(collect(llm, "a", [1], 3), collect(llm, "b", [2], 5))

    a, b = asyncio.run(main())
    llm.shutdown()
    assert [o.request_id for o in a] == ["a"] * 3 and a[-1].finished
    assert [o.request_id for o in b] == ["b"] * 5 and b[-1].finished
    assert engine.threads == {"vllm-engine"}  # vLLM is only ever called from its own thread
    assert engine.shut_down and engine.aborted == []


def test_leaving_a_stream_early_aborts_that_request_only() -> None:
    engine = ScriptedEngine()
    llm = start(engine)

    async def main() -> tuple[list[Output], list[Output]]:
        other = asyncio.create_task(collect(llm, "keep", [1], 6))
        stream = llm.generate([1], 10**9, "leave")  # runs until aborted
        first = [await anext(stream)]
        await stream.aclose()
        return first, await other

    first, kept = asyncio.run(main())
    llm.shutdown()
    assert first[0].request_id == "leave" and not first[0].finished
    assert engine.aborted == ["leave"]
    assert len(kept) == 6 and kept[-1].finished


def test_a_rejected_request_fails_alone() -> None:
    engine = ScriptedEngine()
    llm = start(engine)

    async def main() -> list[Output]:
        with pytest.raises(ValueError, match="empty prompt"):
            await collect(llm, "bad", [], 2)
        return await collect(llm, "good", [1], 2)

    assert len(asyncio.run(main())) == 2
    asyncio.run(llm.check_health())
    llm.shutdown()


def test_an_engine_failure_reaches_every_stream_and_the_health_check() -> None:
    engine = ScriptedEngine(fail_at_step=2)
    llm = start(engine)

    async def main() -> list[BaseException | list[Output]]:
        return await asyncio.gather(collect(llm, "a", [1], 5), collect(llm, "b", [1], 5),
                                    return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(result, RuntimeError) for result in results), results
    with pytest.raises(RuntimeError, match="device lost"):
        asyncio.run(llm.check_health())
    with pytest.raises(RuntimeError, match="engine thread failed"):
        asyncio.run(collect(llm, "c", [1], 1))
    llm.shutdown()  # joins the thread, which has stopped the engine core on its way out
    assert engine.shut_down


def test_a_failed_build_is_raised_to_the_caller() -> None:
    def build() -> None:
        raise MemoryError("no room for the KV cache")

    with pytest.raises(MemoryError, match="KV cache"):
        InprocLLM.start(build)

"""The thread that drives an in-process vLLM EngineCore for AsyncLLM: commands run between steps on
the engine thread, each step's outputs reach the event loop in order, a bad request fails alone,
an engine failure reaches the output handler as vLLM's EngineDeadError. A scripted core stands in
for vLLM's EngineCore here (the real one: tests/integration/test_vllm_inproc.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from vllm.v1.engine import FinishReason
from vllm.v1.engine.exceptions import EngineDeadError

from serving.engines.vllm_inproc import ThreadedCoreClient


@dataclass
class ScriptedCore:
    """Each request runs for its `steps`; records what the driver asked of it."""

    fail_at_step: int | None = None
    requests: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    steps: int = 0
    threads: set[str] = field(default_factory=set)
    shut_down: bool = False

    def __post_init__(self) -> None:
        self.scheduler = SimpleNamespace(has_requests=lambda: bool(self.requests))

    def preprocess_add_request(self, request: SimpleNamespace) -> tuple[SimpleNamespace, int]:
        self.threads.add(threading.current_thread().name)
        if request.steps <= 0:
            raise ValueError("empty prompt")
        return request, 0

    def add_request(self, request: SimpleNamespace, wave: int) -> None:
        self.requests[request.request_id] = request.steps

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def list_loras(self) -> set[int]:
        self.threads.add(threading.current_thread().name)
        return {7}

    def step_fn(self) -> tuple[dict[int, SimpleNamespace], bool]:
        self.threads.add(threading.current_thread().name)
        time.sleep(0.001)  # a step takes time: commands queue up meanwhile
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("device lost")
        done = []
        for request_id in list(self.requests):
            self.requests[request_id] -= 1
            if self.requests[request_id] == 0:
                del self.requests[request_id]
                done.append(request_id)
        return {0: SimpleNamespace(step=self.steps, finished=done)}, True

    def post_step(self, model_executed: bool) -> None:
        pass

    def shutdown(self) -> None:
        self.shut_down = True


def request(request_id: str, steps: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, steps=steps)


async def outputs_until(client: ThreadedCoreClient, finished: set[str]) -> list:
    seen, outputs = set(), []
    while not finished <= seen:
        output = await asyncio.wait_for(client.get_output_async(), 10)
        outputs.append(output)
        seen.update(getattr(output, "finished", None) or getattr(output, "finished_requests", ()))
    return outputs


def test_requests_run_on_the_engine_thread_and_steps_arrive_in_order() -> None:
    core = ScriptedCore()

    async def main() -> list:
        client = ThreadedCoreClient.start(lambda: core)
        await client.add_request_async(request("a", 3))
        await client.add_request_async(request("b", 5))
        outputs = await outputs_until(client, {"a", "b"})
        assert await client.list_loras_async() == {7}  # a utility call answers through a future
        client.shutdown()
        return outputs

    outputs = asyncio.run(main())
    steps = [output.step for output in outputs]
    assert steps == sorted(steps) and steps[-1] >= 5
    assert core.threads == {"vllm-engine"}  # vLLM is only ever called from its own thread
    assert core.shut_down and core.aborted == []


def test_an_abort_stops_that_request_only() -> None:
    core = ScriptedCore()

    async def main() -> None:
        client = ThreadedCoreClient.start(lambda: core)
        await client.add_request_async(request("leave", 10**9))
        await client.add_request_async(request("keep", 6))
        await client.get_output_async()
        await client.abort_requests_async(["leave"])
        await outputs_until(client, {"keep"})
        client.shutdown()

    asyncio.run(main())
    assert core.aborted == ["leave"]


def test_a_rejected_request_fails_alone() -> None:
    core = ScriptedCore()

    async def main() -> list:
        client = ThreadedCoreClient.start(lambda: core)
        await client.add_request_async(request("bad", 0))
        await client.add_request_async(request("good", 2))
        outputs = await outputs_until(client, {"bad", "good"})
        client.shutdown()
        return outputs

    outputs = asyncio.run(main())
    errors = [o for o in outputs if getattr(o, "finished_requests", None)]
    assert [o.outputs[0].finish_reason for o in errors] == [FinishReason.ERROR]
    assert errors[0].outputs[0].request_id == "bad"


def test_an_engine_failure_reaches_the_output_handler_and_marks_the_engine_dead() -> None:
    core = ScriptedCore(fail_at_step=2)

    async def main() -> ThreadedCoreClient:
        client = ThreadedCoreClient.start(lambda: core)
        await client.add_request_async(request("a", 5))
        with pytest.raises(EngineDeadError):
            while True:
                await asyncio.wait_for(client.get_output_async(), 10)
        with pytest.raises(EngineDeadError):
            await client.list_loras_async()
        return client

    client = asyncio.run(main())
    assert client.resources.engine_dead  # AsyncLLM.errored reads this: health checks fail
    client.shutdown()  # joins the thread, which has stopped the core on its way out
    assert core.shut_down


def test_a_failed_build_is_raised_to_the_caller() -> None:
    def build() -> None:
        raise MemoryError("no room for the KV cache")

    async def main() -> None:
        ThreadedCoreClient.start(build)

    with pytest.raises(MemoryError, match="KV cache"):
        asyncio.run(main())

"""vLLM's sleep mode as a warm zero (issue 37): IdleSleeper over a fake engine client with
AsyncLLM's sleep/wake_up signatures and a fake clock. The engine's own sleep is GPU-only, so
this tests the code around it, not vLLM sleeping (untested on hardware here)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from serving.config import PlatformConfig
from serving.engines.vllm_args import server_namespace, server_options
from serving.engines.vllm_sleep import IdleSleeper, awake_for_requests, sleep_when_idle


class FakeEngine:
    """Records calls as vLLM's AsyncLLM would receive them; `gate` holds a sleep mid-way."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gate: asyncio.Event | None = None

    async def sleep(self, level: int = 1, mode: Any = "abort") -> None:
        self.calls.append(("sleep", (level, mode)))
        if self.gate is not None:
            await self.gate.wait()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sleeper(idle_s: float = 60) -> tuple[IdleSleeper, FakeEngine, Clock]:
    engine, clock = FakeEngine(), Clock()
    return IdleSleeper(engine, idle_s, clock=clock), engine, clock


async def test_it_sleeps_at_level_one_after_the_idle_spell() -> None:
    idle, engine, clock = sleeper(60)
    clock.now += 59
    assert not await idle.sleep_if_idle()
    clock.now += 1
    assert await idle.sleep_if_idle()
    assert engine.calls == [("sleep", (1, "wait"))]  # weights to CPU, KV cache freed
    assert not await idle.sleep_if_idle()  # once
    assert idle.asleep and idle.sleeps == 1


async def test_the_next_request_wakes_it_first() -> None:
    idle, engine, clock = sleeper(60)
    clock.now += 60
    await idle.sleep_if_idle()
    async with idle.serving():
        assert engine.calls[-1] == ("wake_up", None) and not idle.asleep
    assert [name for name, _ in engine.calls] == ["sleep", "wake_up"]


async def test_a_request_in_flight_keeps_it_awake() -> None:
    """A stream longer than idle_s: idleness counts from its end."""
    idle, engine, clock = sleeper(60)
    async with idle.serving():
        clock.now += 600
        assert not await idle.sleep_if_idle()
    clock.now += 59
    assert not await idle.sleep_if_idle()
    assert engine.calls == []


async def test_a_request_while_it_falls_asleep_wakes_it_after() -> None:
    idle, engine, clock = sleeper(60)
    clock.now += 60
    engine.gate = asyncio.Event()
    falling = asyncio.create_task(idle.sleep_if_idle())
    await asyncio.sleep(0)  # the sleep has started and waits on the gate
    served = asyncio.Event()

    async def request() -> None:
        async with idle.serving():
            served.set()

    arriving = asyncio.create_task(request())
    await asyncio.sleep(0)
    assert not served.is_set()  # it waits for the sleep to end, then wakes the engine
    engine.gate.set()
    await asyncio.gather(falling, arriving)
    assert [name for name, _ in engine.calls] == ["sleep", "wake_up"] and not idle.asleep


async def asgi_call(app: Any, method: str) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        return None

    await app({"type": "http", "method": method, "path": "/v1/x"}, receive, send)


async def test_only_requests_for_the_engine_wake_it() -> None:
    idle, engine, clock = sleeper(60)
    seen: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(idle.asleep)

    wrapped = awake_for_requests(app, idle)
    clock.now += 60
    await idle.sleep_if_idle()
    await asgi_call(wrapped, "GET")  # /v1/models, health, stored responses
    assert seen == [True] and idle.asleep
    await asgi_call(wrapped, "POST")
    assert seen == [True, False]
    assert [name for name, _ in engine.calls] == ["sleep", "wake_up"]


async def test_the_replica_hook_wraps_both_entries_and_watches() -> None:
    class App:
        def __init__(self) -> None:
            self.outer: Any = self.entry
            self.below_keys: Any = self.entry
            self.calls = 0

        async def entry(self, scope: Any, receive: Any, send: Any) -> None:
            self.calls += 1

    app, engine = App(), FakeEngine()
    idle = sleep_when_idle(app, engine, 30)
    try:
        assert idle.watcher is not None and not idle.watcher.done()
        await asgi_call(app.outer, "POST")
        await asgi_call(app.below_keys, "POST")
        assert app.calls == 2 and idle.idle_for() < 30
    finally:
        assert idle.watcher is not None
        idle.watcher.cancel()


def gpu_platform(**engine: Any) -> dict[str, Any]:
    return {"vllm": {"resources": {"accelerator": "gpu"}, "engine": engine}}


def test_sleep_mode_is_asked_of_vllm_only_when_configured() -> None:
    on = PlatformConfig.model_validate(gpu_platform(sleep_when_idle_s=300))
    off = PlatformConfig.model_validate(gpu_platform())
    assert server_options(on, "/m")["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in server_options(off, "/m")


def test_sleep_on_the_cpu_is_a_config_error() -> None:
    cpu = {"vllm": {"resources": {"accelerator": "cpu"}, "engine": {"sleep_when_idle_s": 300}}}
    with pytest.raises(ValidationError, match="sleep mode needs a GPU"):
        PlatformConfig.model_validate(cpu)


def test_sleep_with_the_in_process_core_is_a_config_error() -> None:
    platform = gpu_platform(sleep_when_idle_s=300, engine_core="inprocess")
    with pytest.raises(ValidationError, match="needs engine_core: process"):
        PlatformConfig.model_validate(platform)


@pytest.mark.parametrize("load_format", ["runai_streamer", "fastsafetensors"])
def test_load_format_reaches_vllms_engine_args(load_format: str) -> None:
    """`vllm.args` passes vLLM's fast loaders through; their packages are the GPU image's."""
    from serving.engines.vllm_args import async_engine_args

    config = PlatformConfig.model_validate({"vllm": {"args": {"load_format": load_format}}})
    args = server_namespace(config, "/models/qwen")
    assert args.load_format == load_format
    assert async_engine_args(args).load_format == load_format

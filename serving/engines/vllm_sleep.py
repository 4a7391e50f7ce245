"""A "warm zero" for GPU replicas: vLLM's sleep mode after an idle spell, woken by the next request.

vLLM (started with `enable_sleep_mode`, CUDA and ROCm only) can sleep at level 1: it moves the
weights to CPU memory and frees the KV cache, so the replica holds almost no GPU memory, and
`wake_up` copies the weights back, which takes about as long as reading them at host-to-device
bandwidth, far less than a new replica's start. `IdleSleeper` calls `AsyncLLM.sleep` when the
replica has served nothing for `idle_s`, and `wake_up` before the next request that needs the
engine goes in (`awake_for_requests`, an ASGI wrapper in front of vLLM's app). vLLM's own
`/sleep` and `/wake_up` routes (VLLM_SERVER_DEV_MODE) do the same by hand.

Untested on hardware here: the development machines have no GPU, and vLLM's CPU worker ignores
sleep (VLLMEngineConfig refuses the setting on the CPU)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

logger = logging.getLogger(__name__)

ASGIApp = Callable[[dict[str, Any], Any, Any], Any]
SLEEP_LEVEL = 1  # weights to CPU memory, KV cache freed; level 2 drops the weights too


class SleepingEngine(Protocol):
    """What IdleSleeper calls of vLLM's AsyncLLM (vllm/v1/engine/async_llm.py)."""

    async def sleep(self, level: int = 1, mode: Any = "abort") -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> bool: ...


class IdleSleeper:
    """Counts the requests in the engine; sleeps it after `idle_s` without any, wakes it for the
    next. One lock orders sleep and wake, so a request that arrives while the engine falls
    asleep waits for that to finish and then wakes it."""

    def __init__(
        self, engine: SleepingEngine, idle_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.engine = engine
        self.idle_s = idle_s
        self.clock = clock
        self.active = 0
        self.asleep = False
        self.last_active = clock()
        self.sleeps = 0  # times the engine fell asleep (for logs and tests)
        self.watcher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Around one request that needs the engine: awake before, idle clock restarted after."""
        self.active += 1
        try:
            if self.asleep or self._lock.locked():  # asleep, or falling asleep right now
                await self._wake()
            yield
        finally:
            self.active -= 1
            self.last_active = self.clock()

    def idle_for(self) -> float:
        return 0.0 if self.active else self.clock() - self.last_active

    async def sleep_if_idle(self) -> bool:
        """Put the engine to sleep if it has been idle for idle_s; whether it fell asleep now."""
        if self.asleep or self.idle_for() < self.idle_s:
            return False
        async with self._lock:
            if self.asleep or self.active:
                return False
            # "wait": a request that slipped in finishes first; none should, as active is 0.
            await self.engine.sleep(level=SLEEP_LEVEL, mode="wait")
            self.asleep, self.sleeps = True, self.sleeps + 1
        logger.info("engine asleep after %.0f s idle (level %d)", self.idle_s, SLEEP_LEVEL)
        return True

    async def _wake(self) -> None:
        async with self._lock:
            if not self.asleep:
                return
            started = self.clock()
            await self.engine.wake_up()
            self.asleep = False
        logger.info("engine woke up in %.2f s", self.clock() - started)

    async def watch(self, poll_s: float | None = None) -> None:
        """Check for idleness until cancelled (a task the replica keeps)."""
        poll = poll_s if poll_s is not None else min(self.idle_s, 5.0)
        while True:
            await asyncio.sleep(max(poll, 0.1))
            try:
                await self.sleep_if_idle()
            except Exception:  # a failed sleep leaves the engine awake: serve on, log it
                logger.exception("vLLM sleep failed; the engine stays awake")


def needs_engine(scope: dict[str, Any]) -> bool:
    """Requests that reach the engine are POSTs (completions, chat, embeddings, responses,
    tokenize); a GET (models, stored responses, files, health) is answered without it, so it
    neither wakes the engine nor keeps it awake."""
    return scope.get("type") == "http" and scope.get("method") == "POST"


def awake_for_requests(app: ASGIApp, sleeper: IdleSleeper) -> ASGIApp:
    """`app` with the engine awake for every request that needs it, for the whole response (a
    stream included)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not needs_engine(scope):
            await app(scope, receive, send)
            return
        async with sleeper.serving():
            await app(scope, receive, send)

    return wrapped


class ServedApp(Protocol):
    """The replica's app (serving.api.vllm_wrap.WrappedApp): the whole chain, and the part below
    the API-key check that batch lines run through."""

    outer: Any  # Starlette's ASGIApp; Any so that engines need not import the HTTP layer's types
    below_keys: Any


def sleep_when_idle(app: ServedApp, engine: SleepingEngine, idle_s: float) -> IdleSleeper:
    """Wrap both entries of the replica's app and start watching for idleness; the task is kept
    on the sleeper (`sleeper.watcher`) for as long as the replica lives."""
    sleeper = IdleSleeper(engine, idle_s)
    app.outer = awake_for_requests(app.outer, sleeper)
    app.below_keys = awake_for_requests(app.below_keys, sleeper)
    sleeper.watcher = asyncio.create_task(sleeper.watch())
    return sleeper

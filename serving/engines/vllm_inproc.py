"""vLLM's engine core inside the replica process, for a faster start (`engine_core: inprocess`).

`AsyncLLM` always spawns its engine core as a child process that imports torch and vLLM again
(most of a replica's start-up on a busy CPU). Here `AsyncLLM` keeps everything it does (input
processing, output processing, stat loggers, the `EngineClient` that vLLM's OpenAI app serves)
and talks to an `EngineCore` in this process instead, through `ThreadedCoreClient`: vLLM's async
engine-core client interface over one thread that owns the core. The thread builds it (so vLLM's
CPU thread binding applies to the thread that runs the model), adds and aborts requests between
steps, runs the steps and hands each step's outputs to the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import sys
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # vLLM is heavy: imported where it runs, named here for the annotations
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

Command = Callable[[Any], Any]  # runs on the engine thread with the EngineCore
SWITCH_INTERVAL_S = 50e-6  # the replica process's GIL switch interval (see InprocAsyncLLM)


class ThreadedCoreClient:
    """The async part of vLLM's `EngineCoreClient` that `AsyncLLM` uses, over an in-process
    `EngineCore` driven by one thread. Outputs go to an asyncio queue, as `AsyncMPClient`'s
    arrive from the engine-core process."""

    def __init__(self, build: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self._build = build
        self._loop = loop
        self._commands: queue.SimpleQueue[tuple[Command, concurrent.futures.Future | None]] = (
            queue.SimpleQueue()
        )
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stopping = False
        self.error: BaseException | None = None
        self.core: Any = None
        self.resources = SimpleNamespace(engine_dead=False)  # read by AsyncLLM.errored
        self.engine_ranks_managed = [0]
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)

    @classmethod
    def start(cls, build: Callable[[], Any]) -> ThreadedCoreClient:
        """Start the engine thread on `build()`'s core; blocks until it is up (as the process
        client does) and raises what building raised."""
        client = cls(build, asyncio.get_running_loop())
        client._thread.start()
        client._ready.wait()
        if client.error is not None:
            raise client.error
        return client

    # What AsyncLLM calls on its engine-core client.
    async def get_output_async(self) -> Any:
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            from vllm.v1.engine.exceptions import EngineDeadError

            raise EngineDeadError(suppress_context=True) from item
        return item

    async def add_request_async(self, request: Any) -> None:
        self._post(lambda core: self._add(core, request))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids:
            self._post(lambda core: core.abort_requests(request_ids))

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return await self._call(lambda core: core.get_supported_tasks())

    async def add_lora_async(self, lora_request: Any) -> bool:
        return await self._call(lambda core: core.add_lora(lora_request))

    async def remove_lora_async(self, lora_id: int) -> bool:
        return await self._call(lambda core: core.remove_lora(lora_id))

    async def list_loras_async(self) -> set[int]:
        return await self._call(lambda core: core.list_loras())

    async def pin_lora_async(self, lora_id: int) -> bool:
        return await self._call(lambda core: core.pin_lora(lora_id))

    async def reset_prefix_cache_async(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        return await self._call(
            lambda core: core.reset_prefix_cache(reset_running_requests, reset_connector)
        )

    async def reset_mm_cache_async(self) -> None:
        await self._call(lambda core: core.reset_mm_cache())

    async def reset_encoder_cache_async(self) -> None:
        await self._call(lambda core: core.reset_encoder_cache())

    async def is_sleeping_async(self) -> bool:
        return await self._call(lambda core: core.is_sleeping())

    async def collective_rpc_async(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        return await self._call(lambda core: core.collective_rpc(method, timeout, args, kwargs))

    def dp_engines_running(self) -> bool:
        return False

    def get_kv_event_sources(self) -> dict:
        return {}

    def shutdown(self, timeout: float | None = None) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout or 30)

    # The engine thread.
    def _post(self, command: Command) -> None:
        self._commands.put((command, None))
        self._wake.set()

    async def _call(self, command: Command) -> Any:
        """Run `command` on the engine thread between steps and await its result."""
        if self.error is not None or not self._thread.is_alive():
            from vllm.v1.engine.exceptions import EngineDeadError

            raise EngineDeadError()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((command, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    def _add(self, core: Any, request: Any) -> None:
        try:
            core.add_request(*core.preprocess_add_request(request))
        except Exception:  # a bad request fails alone, as in vLLM's engine-core process
            logger.exception("could not add request %s", request.request_id)
            self._deliver(_finished([request.request_id], error=True))

    def _run(self) -> None:
        try:
            self.core = self._build()
        except BaseException as err:  # noqa: BLE001 - raised to the caller of start()
            self.error = err
            return
        finally:
            self._ready.set()
        try:
            while not self._stopping:
                self._wake.clear()
                self._run_commands()
                if not self.core.scheduler.has_requests():
                    self._wake.wait()  # a command (or shutdown) sets it
                    continue
                outputs, executed = self.core.step_fn()
                self.core.post_step(executed)
                for output in (outputs or {}).values():
                    self._deliver(output)
        except BaseException as err:  # noqa: BLE001 - AsyncLLM fails every open request
            logger.exception("vLLM engine thread failed")
            self.error = err
            self.resources.engine_dead = True
            self._deliver(err)
        finally:
            self.core.shutdown()

    def _run_commands(self) -> None:
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = command(self.core)
            except Exception as err:  # noqa: BLE001 - handed to the awaiting caller
                if future is None:
                    logger.exception("engine command failed")
                else:
                    future.set_exception(err)
            else:
                if future is not None:
                    future.set_result(result)

    def _deliver(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the replica is going
            self._loop.call_soon_threadsafe(self._outputs.put_nowait, item)


def _finished(request_ids: list[str], error: bool) -> Any:
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

    reason = FinishReason.ERROR if error else FinishReason.ABORT
    outputs = [EngineCoreOutput(rid, [], finish_reason=reason) for rid in request_ids]
    return EngineCoreOutputs(finished_requests=set(request_ids), outputs=outputs)


def inproc_async_llm_class() -> type[AsyncLLM]:
    """`AsyncLLM` with its engine core in this process (imported lazily: vLLM is heavy)."""
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import EngineCoreClient

    class InprocAsyncLLM(AsyncLLM):
        def __init__(
            self, vllm_config: Any, executor_class: Any, log_stats: bool, **kwargs: Any
        ) -> None:
            def build() -> Any:
                return EngineCore(vllm_config, executor_class, log_stats)

            # The model's forward releases the GIL around each torch op and takes it back
            # hundreds of times a step; while the event loop (HTTP streaming) holds it, each
            # take-back can wait out the switch interval (5 ms by default): at 16 streams a
            # decode step took 1.9x as long as under `vllm serve`. At 50 us it is at parity.
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            # AsyncLLM builds its client with this factory; swap it for the duration of the
            # constructor only (one replica builds one engine, on the event loop's thread).
            factory = EngineCoreClient.__dict__["make_async_mp_client"]
            swap = staticmethod(lambda *args, **kw: ThreadedCoreClient.start(build))
            EngineCoreClient.make_async_mp_client = swap  # type: ignore[method-assign]  # deliberate swap, undone below
            try:
                super().__init__(vllm_config, executor_class, log_stats, **kwargs)
            finally:
                EngineCoreClient.make_async_mp_client = factory  # type: ignore[method-assign]  # undoes the swap

    return InprocAsyncLLM

"""vLLM's engine core inside the replica process, for a faster start.

`AsyncLLM` always spawns its engine core as a child process that imports torch and vLLM again
(most of a replica's start-up on a busy CPU), and refuses to run it in-process under asyncio.
vLLM's `LLMEngine` does run it in-process (`InprocClient`); this drives one from a single
thread and gives asyncio callers the small part of `AsyncLLM` that `VLLMEngine` uses.
The thread owns the engine: it builds it (so vLLM's CPU thread binding applies to the thread
that runs the model), adds and aborts requests between steps, and runs the steps.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

Command = Callable[[Any], None]  # runs on the engine thread with the LLMEngine
SWITCH_INTERVAL_S = 50e-6  # the replica process's GIL switch interval (see from_vllm_config)


class InprocLLM:
    """`generate` / `abort` / `check_health` / `shutdown` over an in-process `LLMEngine`."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._commands: queue.SimpleQueue[tuple[str | None, Command]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stopping = False
        self.error: BaseException | None = None
        self.engine: Any = None
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any, stat_loggers: list[Any]) -> InprocLLM:
        """Build the engine on its own thread; blocks until it is up (as `AsyncLLM` does)."""

        def build() -> Any:
            from vllm.v1.engine.llm_engine import LLMEngine
            from vllm.v1.executor import Executor

            return LLMEngine(
                vllm_config, Executor.get_class(vllm_config), log_stats=True,
                stat_loggers=stat_loggers, multiprocess_mode=False,
            )

        # The model's forward releases the GIL around each torch op and takes it back hundreds of
        # times a step; while the replica's event loop (HTTP streaming) holds it, each take-back
        # can wait out the switch interval (5 ms by default): at 16 streams a decode step took
        # 1.9x as long as under `vllm serve`. At 50 us it is at parity (bench-cpu-inprocess.yaml).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        return cls.start(build)

    @classmethod
    def start(cls, build: Callable[[], Any]) -> InprocLLM:
        """Start the engine thread on `build()`'s engine; raises what building raised."""
        llm = cls(build)
        llm._thread.start()
        llm._ready.wait()
        if llm.error is not None:
            raise llm.error
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def output_processor(self) -> Any:
        """vLLM's request states (`VLLMEngine.stats` counts them, as with `AsyncLLM`)."""
        return self.engine.output_processor

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """Stream the request's `RequestOutput`s; leaving early aborts it in the engine."""
        self.raise_if_dead()
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), stream)
        self._submit(request_id, lambda engine: engine.add_request(request_id, prompt, params))
        finished = False
        try:
            while not finished:
                output = await stream.get()
                if isinstance(output, BaseException):
                    finished = True
                    raise output
                finished = output.finished
                yield output
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(None, lambda engine: engine.abort_request([request_id]))

    async def abort(self, request_id: str) -> None:
        self._submit(None, lambda engine: engine.abort_request([request_id]))

    def raise_if_dead(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"vLLM engine thread failed: {self.error!r}") from self.error
        if not self._thread.is_alive():
            raise RuntimeError("vLLM engine thread is not running")

    async def check_health(self) -> None:
        self.raise_if_dead()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _submit(self, request_id: str | None, command: Command) -> None:
        self._commands.put((request_id, command))
        self._wake.set()

    def _run(self) -> None:
        try:
            self.engine = self._build()
        except BaseException as err:  # noqa: BLE001 - handed to the caller of from_vllm_config
            self.error = err
            return
        finally:
            self._ready.set()
        try:
            while not self._stopping:
                self._wake.clear()
                self._run_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()  # a command (or shutdown) sets it
                    continue
                for output in self.engine.step():
                    self._deliver(output.request_id, output)
        except BaseException as err:  # noqa: BLE001 - every open stream gets the error
            self.error = err
            for request_id in list(self._streams):
                self._deliver(request_id, err)
        finally:
            self.engine.engine_core.shutdown()

    def _run_commands(self) -> None:
        while True:
            try:
                request_id, command = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command(self.engine)
            except Exception as err:  # noqa: BLE001 - a bad request fails alone
                if request_id is not None:
                    self._deliver(request_id, err)

    def _deliver(self, request_id: str, item: Any) -> None:
        target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            try:
                loop.call_soon_threadsafe(stream.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting
                self._streams.pop(request_id, None)

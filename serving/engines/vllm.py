"""vLLM V1 engine behind the Engine protocol: continuous batching happens inside it. The engine
core runs in `AsyncLLM`'s child process, or in the replica (`engine_core: inprocess`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.config import PlatformConfig
from serving.engines.base import Delta, EngineStats, SamplingSpec, model_sampling_defaults
from serving.engines.cpu_priority import child_thread_ids, lower_priority, thread_ids
from serving.engines.vllm_startup import (
    install_phase_log,
    phase_seconds,
    read_markers,
    remove_phase_log,
)


def vllm_env(config: PlatformConfig) -> dict[str, str]:
    """Environment the engine needs before `vllm` is imported (set in the replica)."""
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if config.vllm.resources.accelerator == "cpu":
        # vLLM CPU swaps the "uni" executor for "mp" (a third process that imports torch and vLLM
        # again) unless this is 0. The model then runs inside the engine core's process (a child
        # of the replica, or the replica itself with engine_core inprocess).
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    threads = config.vllm.engine.cpu_threads
    if config.vllm.resources.accelerator == "cpu" and threads is not None:
        # torch reads this on import: the replica gets it from its runtime_env, a spawned engine
        # core inherits it.
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def apply_engine_env(config: PlatformConfig, environ: MutableMapping[str, str]) -> None:
    """Set `vllm_env` in `environ` (explicit settings win) after lifting Ray's thread cap on CPU."""
    if config.vllm.resources.accelerator == "cpu":
        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (1) in every worker it starts, and
        # vLLM CPU honours it: the model would run on one core. Unset, torch takes every core,
        # as under plain `vllm serve`; `cpu_threads` in the config sets it.
        environ.pop("OMP_NUM_THREADS", None)
    for key, value in vllm_env(config).items():
        environ.setdefault(key, value)


def yield_cpu_to_control_plane(config: PlatformConfig) -> None:
    """Lower the priority of the threads that run the model, now that the engine serves (see
    cpu_priority): the engine-core child's, or, with the engine core in-process, every thread of
    the replica, since they share the engine's GIL (an event loop above the engine thread takes
    the GIL back from it at every torch op: 16 streams decoded at half speed)."""
    niceness = config.vllm.engine.cpu_niceness
    if config.vllm.resources.accelerator != "cpu" or niceness is None:
        return
    in_child = config.vllm.engine.engine_core == "process"
    lower_priority(child_thread_ids() if in_child else thread_ids(), niceness)


def engine_args(config: PlatformConfig, model_dir: Path) -> dict[str, Any]:
    """Keyword arguments of vLLM's `AsyncEngineArgs`, from the platform config."""
    engine = config.vllm.engine
    accelerator = config.vllm.resources.accelerator
    return {
        "model": str(model_dir),
        "served_model_name": [config.model.name],
        "dtype": config.model.dtype,
        "max_model_len": config.model.max_model_len,
        "gpu_memory_utilization": engine.memory_utilization(accelerator),
        "enforce_eager": engine.enforce_eager,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "kv_cache_memory_bytes": _gib_to_bytes(engine.kv_cache_memory_gb),
        "seed": engine.seed,
        # One replica = one engine on one device: run the model inside the engine-core process,
        # never as Ray actors nested in the Serve replica (on CPU see vllm_env).
        "distributed_executor_backend": "uni",
        "tensor_parallel_size": 1,
    }


def _gib_to_bytes(gib: float | None) -> int | None:
    return None if gib is None else int(gib * 1024**3)


def sampling_params(spec: SamplingSpec):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        min_p=spec.min_p,
        repetition_penalty=spec.repetition_penalty,
        stop=list(spec.stop) or None,
        seed=spec.seed,
        ignore_eos=spec.ignore_eos,
        min_tokens=spec.min_tokens,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        output_kind=RequestOutputKind.DELTA,
    )


@dataclass
class SchedulerSnapshot:
    """Latest scheduler stats from the engine core, written by `SchedulerStatsRecorder`."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0


def scheduler_stats_logger(snapshot: SchedulerSnapshot):
    """A vLLM stat-logger factory that keeps the latest queue depth in `snapshot`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerStatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.snapshot = snapshot

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                self.snapshot.running = scheduler_stats.num_running_reqs
                self.snapshot.waiting = (
                    scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                )
                self.snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return SchedulerStatsRecorder


class VLLMEngine:
    """One vLLM engine per replica (`AsyncLLM`, or `InprocLLM` with the same small interface);
    requests stream back as text deltas."""

    modes: tuple[str, ...] = ()

    def __init__(self, llm: Any, model_name: str, max_model_len: int, snapshot: SchedulerSnapshot):
        self.startup_timings: dict[str, float] = {}
        self.llm = llm
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.tokenizer = llm.tokenizer
        self.sampling_defaults: dict[str, float] = {}
        self._snapshot = snapshot
        self._aborted_total = 0

    @classmethod
    def start(cls, config: PlatformConfig, model_dir: Path) -> VLLMEngine:
        apply_engine_env(config, os.environ)
        started = time.perf_counter()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from serving.engines.vllm_inproc import InprocLLM

        imported = time.perf_counter()
        phase_log = install_phase_log()  # before the config: it copies vLLM's logging settings
        snapshot = SchedulerSnapshot()
        try:
            vllm_config = AsyncEngineArgs(**engine_args(config, model_dir)).create_engine_config()
            configured = time.perf_counter()
            # Blocks until the engine core has loaded the weights, sized the KV cache, warmed up.
            spawned_at = time.time()
            engine_class = AsyncLLM if config.vllm.engine.engine_core == "process" else InprocLLM
            llm = engine_class.from_vllm_config(
                vllm_config, stat_loggers=[scheduler_stats_logger(snapshot)]
            )
            marks = {**read_markers(phase_log), "start": spawned_at, "ready": time.time()}
            yield_cpu_to_control_plane(config)
        finally:
            remove_phase_log(phase_log)
        engine = cls(llm, config.model.name, config.model.max_model_len, snapshot)
        engine.sampling_defaults = model_sampling_defaults(model_dir)
        engine.startup_timings = {
            "import_vllm": round(imported - started, 2),
            "engine_config": round(configured - imported, 2),
            "engine_core": round(time.perf_counter() - configured, 2),
            **phase_seconds(marks),
        }
        return engine

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec
    ) -> AsyncIterator[Delta]:
        from vllm.inputs.engine import tokens_input

        # The engine's generate aborts the request itself when this iteration is cancelled.
        stream = self.llm.generate(tokens_input(prompt_token_ids), sampling_params(sampling), request_id)
        try:
            async for output in stream:
                completion = output.outputs[0]
                yield Delta(
                    text=completion.text,
                    num_tokens=len(completion.token_ids),
                    finish_reason=_finish_reason(completion.finish_reason),
                )
        except (asyncio.CancelledError, GeneratorExit):
            self._aborted_total += 1
            await stream.aclose()  # run the engine's abort now, not at garbage collection
            raise

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    def stats(self) -> EngineStats:
        in_flight = self.llm.output_processor.get_num_unfinished_requests()
        if in_flight == 0:  # the engine core reports no stats while idle: nothing is left
            return EngineStats(running=0, waiting=0, aborted_total=self._aborted_total)
        snap = self._snapshot
        return EngineStats(
            running=min(snap.running, in_flight),
            waiting=min(snap.waiting, in_flight),
            kv_cache_usage=snap.kv_cache_usage,
            aborted_total=self._aborted_total,
        )

    async def check_health(self) -> None:
        await self.llm.check_health()

    def shutdown(self) -> None:
        self.llm.shutdown()


def _finish_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"

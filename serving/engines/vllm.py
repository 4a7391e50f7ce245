"""The vLLM V1 engine of a replica (continuous batching happens inside it) and what the platform
reads of it. The engine core runs in `AsyncLLM`'s child process, or in the replica
(`engine_core: inprocess`)."""

from __future__ import annotations

import os
import time
from argparse import Namespace
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.config import PlatformConfig
from serving.engines.base import EngineStats
from serving.engines.cpu_priority import child_thread_ids, lower_priority, thread_ids
from serving.engines.vllm_args import async_engine_args, server_namespace
from serving.engines.vllm_startup import (
    install_phase_log,
    phase_seconds,
    read_markers,
    remove_phase_log,
    startup_phases,
)
from serving.metrics import PlatformMetrics
from serving.tracing.setup import tracing_env


def vllm_env(config: PlatformConfig) -> dict[str, str]:
    """Environment the engine needs before `vllm` is imported (set in the replica)."""
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    # vLLM's own cap on `n` and a beam search's width (16384 by default) is the platform's.
    env["VLLM_MAX_N_SEQUENCES"] = str(config.limits.max_n)
    if config.vllm.resources.accelerator == "cpu":
        # vLLM CPU swaps the "uni" executor for "mp" (a third process that imports torch and vLLM
        # again) unless this is 0. The model then runs inside the engine core's process (a child
        # of the replica, or the replica itself with engine_core inprocess).
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Never VLLM_ALLOW_RUNTIME_LORA_UPDATING: its routes (and SageMaker's /adapters) would load
    # any path; runtime adapters go through the model router's checks (vllm_lora.py loads them).
    threads = config.vllm.engine.cpu_threads
    if config.vllm.resources.accelerator == "cpu" and threads is not None:
        # torch reads this on import: the replica gets it from its runtime_env, a spawned engine
        # core inherits it.
        env["OMP_NUM_THREADS"] = str(threads)
    return env | tracing_env(config.tracing)


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


@dataclass
class SchedulerSnapshot:
    """Latest scheduler stats from the engine core, written by the engine's stat logger."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    aborted_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


def engine_stats_logger(
    snapshot: SchedulerSnapshot,
    metrics: PlatformMetrics | None,
    startup_at: dict[str, float] | None = None,
):
    """A vLLM stat-logger factory: the queue into `snapshot`, each step's request timings into
    the platform metrics. vLLM measures them where its own Prometheus metrics come from (arrival
    in the replica to each output), so nothing is timed per streamed chunk on the HTTP path.
    The step that produces the replica's first token closes its start-up (`startup_at`)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PlatformStatsLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.snapshot = snapshot

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                snapshot.running = scheduler_stats.num_running_reqs
                snapshot.waiting = (
                    scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                )
                snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage
                record_prefix_cache(snapshot, metrics, scheduler_stats.prefix_cache_stats)
            if iteration_stats is not None and startup_at is not None:
                record_first_token(startup_at, metrics, iteration_stats)
            if iteration_stats is not None and metrics is not None:
                record_iteration(metrics, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return PlatformStatsLogger


def record_prefix_cache(
    snapshot: SchedulerSnapshot, metrics: PlatformMetrics | None, stats: Any
) -> None:
    """Each step's prefix-cache lookups (prompt tokens) and hits, summed since start."""
    if stats is None or not stats.queries:
        return
    snapshot.prefix_cache_queries += stats.queries
    snapshot.prefix_cache_hits += stats.hits
    if metrics is not None:
        metrics.record_prefix_cache(stats.queries, stats.hits)


def count_aborts(llm: Any, snapshot: SchedulerSnapshot) -> None:
    """Count the requests the engine aborts (a client gone, a deadline): AsyncLLM aborts a request
    whose stream is cancelled through `abort`, and vLLM keeps no statistics of aborted ones."""
    abort = llm.abort

    async def counted(request_id: Any, *args: Any, **kwargs: Any) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        snapshot.aborted_total += len(ids)
        await abort(ids, *args, **kwargs)

    llm.abort = counted


def record_first_token(
    startup_at: dict[str, float], metrics: PlatformMetrics | None, stats: Any
) -> None:
    """The first step with a first token: the replica's start-up ends (its phases exported)."""
    if "first_token" in startup_at or not stats.time_to_first_tokens_iter:
        return
    startup_at["first_token"] = time.time()
    if metrics is not None:
        metrics.record_startup(startup_phases(startup_at))


def process_created_at() -> float:
    """When this process started (epoch seconds): the Ray worker that hosts the replica."""
    import psutil

    return float(psutil.Process().create_time())


def record_iteration(metrics: PlatformMetrics, stats: Any) -> None:
    """One engine step's `IterationStats` into the platform's TTFT / ITL / e2e / token metrics."""
    for ttft in stats.time_to_first_tokens_iter:
        metrics.record_first_token(ttft)
    for gap in stats.inter_token_latencies_iter:
        metrics.record_inter_token(gap)
    for finished in stats.finished_requests:
        metrics.record_request(
            finished.num_prompt_tokens, finished.num_generation_tokens, finished.e2e_latency
        )


class VLLMEngine:
    """One vLLM engine per replica: `AsyncLLM` (its engine core in a child process, or in this
    process with `engine_core: inprocess`), built from the replica's `vllm serve` options. vLLM's
    OpenAI app serves it (`serving/deployments/vllm_app.py`); this keeps what the platform reads
    of it: the queue, health, start-up timings."""

    def __init__(self, llm: Any, args: Namespace, model_name: str, snapshot: SchedulerSnapshot):
        self.startup_timings: dict[str, float] = {}
        # Moments of the start (epoch seconds) for `startup_phases`; the replica adds its own.
        self.startup_at: dict[str, float] = {}
        self.llm = llm
        self.args = args
        self.model_name = model_name
        self._snapshot = snapshot

    @classmethod
    def start(
        cls,
        config: PlatformConfig,
        model_dir: Path,
        metrics: PlatformMetrics | None = None,
        preload_adapters: bool = True,
    ) -> VLLMEngine:
        apply_engine_env(config, os.environ)
        startup_at = {"process_created": process_created_at(), "engine_start": time.time()}
        started = time.perf_counter()
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from serving.engines.vllm_inproc import inproc_async_llm_class

        imported = time.perf_counter()
        phase_log = install_phase_log()  # before the config: it copies vLLM's logging settings
        snapshot = SchedulerSnapshot()
        try:
            args = server_namespace(config, model_dir, preload_adapters)
            engine_args = async_engine_args(args)
            vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
            configured = time.perf_counter()
            # Blocks until the engine core has loaded the weights, sized the KV cache, warmed up.
            spawned_at = time.time()
            in_child = config.vllm.engine.engine_core == "process"
            engine_class = AsyncLLM if in_child else inproc_async_llm_class()
            llm = engine_class.from_vllm_config(
                vllm_config,
                usage_context=UsageContext.OPENAI_API_SERVER,
                stat_loggers=[engine_stats_logger(snapshot, metrics, startup_at)],
                enable_log_requests=engine_args.enable_log_requests,
                disable_log_stats=engine_args.disable_log_stats,
            )
            count_aborts(llm, snapshot)
            marks = {**read_markers(phase_log), "start": spawned_at, "ready": time.time()}
            startup_at.update(read_markers(phase_log), engine_ready=marks["ready"])
            yield_cpu_to_control_plane(config)
        finally:
            remove_phase_log(phase_log)
        engine = cls(llm, args, config.model.name, snapshot)
        engine.startup_at = startup_at
        engine.startup_timings = {
            "import_vllm": round(imported - started, 2),
            "engine_config": round(configured - imported, 2),
            "engine_core": round(time.perf_counter() - configured, 2),
            **phase_seconds(marks),
        }
        return engine

    def in_flight(self) -> int:
        """Requests in the engine now, running or waiting (exact: vLLM's own count)."""
        return int(self.llm.output_processor.get_num_unfinished_requests())

    def stats(self) -> EngineStats:
        in_flight = self.in_flight()
        snap = self._snapshot
        totals = {
            "aborted_total": snap.aborted_total,
            "prefix_cache_queries": snap.prefix_cache_queries,
            "prefix_cache_hits": snap.prefix_cache_hits,
        }
        if in_flight == 0:  # the engine core reports no stats while idle: nothing is left
            return EngineStats(running=0, waiting=0, **totals)
        return EngineStats(
            running=min(snap.running, in_flight),
            waiting=min(snap.waiting, in_flight),
            kv_cache_usage=snap.kv_cache_usage,
            **totals,
        )

    async def check_health(self) -> None:
        await self.llm.check_health()

    def shutdown(self) -> None:
        self.llm.shutdown()

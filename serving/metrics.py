"""Every platform metric, named once. Exported through Ray's metrics pipeline (`ray.util.metrics`),
so they appear on each node's Prometheus endpoint (prefixed `ray_`) and in the Ray dashboard.

Labels on all of them: `engine` (vllm | hf), `model`, `deployment`, `replica` (Serve's replica id);
requests also carry `status`, adapter loads `adapter`, start-up phases `phase`."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serving.engines.base import EngineStats

LABELS = ("engine", "model", "deployment", "replica")
# Latency buckets in seconds: CPU decode steps are tens of ms, CPU prefill and queueing seconds.
LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]

QUEUE_DEPTH = "llm_serving_queue_depth"
RUNNING = "llm_serving_running_requests"
KV_CACHE_USAGE = "llm_serving_kv_cache_usage"
TTFT = "llm_serving_time_to_first_token_seconds"
ITL = "llm_serving_inter_token_latency_seconds"
E2E = "llm_serving_e2e_request_latency_seconds"
PROMPT_TOKENS = "llm_serving_prompt_tokens_total"
GENERATION_TOKENS = "llm_serving_generation_tokens_total"
REQUESTS = "llm_serving_requests_total"
ADAPTER_LOADS = "llm_serving_adapter_loads_total"
PREFIX_CACHE_QUERIES = "llm_serving_prefix_cache_queries_total"
PREFIX_CACHE_HITS = "llm_serving_prefix_cache_hits_total"
REPLICA_STARTUP = "llm_serving_replica_startup_seconds"
# Per tenant (auth.tenants) and adapter, from each engine request's own counts (serving/api/usage.py).
TENANT_REQUESTS = "llm_serving_tenant_requests_total"
TENANT_PROMPT_TOKENS = "llm_serving_tenant_prompt_tokens_total"
TENANT_CACHED_TOKENS = "llm_serving_tenant_cached_prompt_tokens_total"
TENANT_OUTPUT_TOKENS = "llm_serving_tenant_output_tokens_total"
TENANT_TOKENS = (TENANT_PROMPT_TOKENS, TENANT_CACHED_TOKENS, TENANT_OUTPUT_TOKENS)

# Set by every engine report (`record_engine`), so they exist from a replica's start.
ENGINE_GAUGES = (QUEUE_DEPTH, RUNNING, KV_CACHE_USAGE)
# Ray's metrics agent exports no histogram before its first observation (it skips data points
# with count 0: ray/dashboard/modules/reporter/reporter_agent.py, _export_histogram_data).
HISTOGRAMS = (TTFT, ITL, E2E)
# Statuses whose request counter a replica exports at 0 from its start, so the dashboard's
# Requests and Errors panels (and its engine and model variables) have series before the first
# request: success and the refusals clients see most (bad input, a limit, a full queue).
STATUSES_AT_START = ("200", "400", "429", "503")

DESCRIPTIONS = {
    QUEUE_DEPTH: "Requests waiting inside the engine, not yet scheduled (queue depth).",
    RUNNING: "Requests the engine is generating for.",
    KV_CACHE_USAGE: "Share of the KV cache in use, 0..1.",
    TTFT: "Time from request arrival to the first generated token.",
    ITL: "Time between consecutive streamed outputs of one request (TPOT when one token each).",
    E2E: "Time from request arrival to its last token.",
    PROMPT_TOKENS: "Prompt tokens processed.",
    GENERATION_TOKENS: "Tokens generated.",
    REQUESTS: "Finished HTTP requests by status code.",
    ADAPTER_LOADS: "LoRA adapters loaded into a replica's engine, by adapter (model multiplexing).",
    PREFIX_CACHE_QUERIES: "Prompt tokens looked up in the engine's prefix cache.",
    PREFIX_CACHE_HITS: "Prompt tokens found in the engine's prefix cache (hit rate: hits / queries).",
    TENANT_REQUESTS: "Engine requests per tenant and adapter, by outcome (ok, error, refused: "
    "over one of the tenant's limits).",
    TENANT_PROMPT_TOKENS: "Prompt tokens per tenant and adapter.",
    TENANT_CACHED_TOKENS: "Prompt tokens per tenant and adapter found in the prefix cache.",
    TENANT_OUTPUT_TOKENS: "Output tokens per tenant and adapter.",
    REPLICA_STARTUP: "Seconds each phase of this replica's start took, by phase (set once per "
    "replica: process_up, imports, weights_loaded, kv_cache_allocated, warmup, replica_ready, "
    "first_token, and first_request_served = process start -> first token).",
}


@dataclass(frozen=True)
class MetricLabels:
    engine: str
    model: str
    deployment: str
    replica: str = ""

    def as_tags(self) -> dict[str, str]:
        return {
            "engine": self.engine,
            "model": self.model,
            "deployment": self.deployment,
            "replica": self.replica,
        }


def counters_at_start(
    engine: str, adapters: tuple[str, ...] = (), tenants: tuple[str, ...] = ()
) -> list[tuple[str, dict]]:
    """(counter, its extra labels) a replica exports at 0 when it starts: every label set the
    dashboard reads, so no panel of a fresh install says "No data" until something is counted."""
    counters: list[tuple[str, dict]] = [(PROMPT_TOKENS, {}), (GENERATION_TOKENS, {})]
    for tenant in tenants:  # the base model's; an adapter's appear with its first request
        counters.append((TENANT_REQUESTS, {"tenant": tenant, "adapter": "", "outcome": "ok"}))
        counters += [(name, {"tenant": tenant, "adapter": ""}) for name in TENANT_TOKENS]
    counters += [(REQUESTS, {"status": status}) for status in STATUSES_AT_START]
    counters += [(ADAPTER_LOADS, {"adapter": adapter}) for adapter in adapters]
    if engine == "vllm":  # only vLLM has a prefix cache
        counters += [(PREFIX_CACHE_QUERIES, {}), (PREFIX_CACHE_HITS, {})]
    return counters


def record_zero(counter: Any, tags: dict[str, str]) -> None:
    """Export `counter` at 0 for `tags`. Ray's `Counter.inc` refuses 0; `_record` is what it calls
    after that check. The metrics agent keeps a counter once it has one point (it never ages
    counters out, unlike gauges): recorded once, it stays in every scrape."""
    counter._record(0, tags)


class BackgroundRecorder:
    """Runs metric updates in order on one daemon thread. Ray's `record` releases the GIL, and
    taking it back waits out another thread's switch interval (up to 5 ms; measured 3.6 ms per
    call beside one busy thread): inline, every streamed token stalled the replica's event loop."""

    def __init__(self, max_pending: int = 100_000) -> None:
        self._calls: queue.Queue[tuple[Callable[..., Any], tuple]] = queue.Queue(max_pending)
        self.dropped = 0  # updates lost because Ray fell `max_pending` behind
        threading.Thread(target=self._run, name="metrics-recorder", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue an update; never blocks the caller (a full queue drops it and counts it)."""
        try:
            self._calls.put_nowait((fn, args))
        except queue.Full:
            self.dropped += 1

    def flush(self) -> None:
        """Wait until every submitted update has run."""
        self._calls.join()

    def _run(self) -> None:
        while True:
            fn, args = self._calls.get()
            try:
                fn(*args)
            except Exception:  # a metrics hiccup must never stop the replica
                pass
            finally:
                self._calls.task_done()


class PlatformMetrics:
    """Ray metrics of one replica; create inside a Ray worker (a Serve replica). Updates are
    queued to a `BackgroundRecorder`, so the request path never waits on Ray. Its counters start
    at 0 for the labels the dashboard reads (`counters_at_start`; `adapters`: the configured ones)."""

    def __init__(
        self, labels: MetricLabels, adapters: tuple[str, ...] = (), tenants: tuple[str, ...] = ()
    ) -> None:
        from ray.util import metrics as ray_metrics

        self.labels = labels
        tags = labels.as_tags()

        def gauge(name: str, extra: tuple[str, ...] = ()):
            metric = ray_metrics.Gauge(name, DESCRIPTIONS[name], tag_keys=LABELS + extra)
            metric.set_default_tags(tags)
            return metric

        def counter(name: str, extra: tuple[str, ...] = ()):
            # Ray appends `_total` to counters itself: register without it.
            metric = ray_metrics.Counter(
                name.removesuffix("_total"), DESCRIPTIONS[name], tag_keys=LABELS + extra
            )
            metric.set_default_tags(tags)
            return metric

        def histogram(name: str):
            metric = ray_metrics.Histogram(
                name, DESCRIPTIONS[name], boundaries=LATENCY_BUCKETS, tag_keys=LABELS
            )
            metric.set_default_tags(tags)
            return metric

        self.queue_depth = gauge(QUEUE_DEPTH)
        self.running = gauge(RUNNING)
        self.kv_cache_usage = gauge(KV_CACHE_USAGE)
        self.replica_startup = gauge(REPLICA_STARTUP, ("phase",))
        self.ttft = histogram(TTFT)
        self.itl = histogram(ITL)
        self.e2e = histogram(E2E)
        self.prompt_tokens = counter(PROMPT_TOKENS)
        self.generation_tokens = counter(GENERATION_TOKENS)
        self.requests = counter(REQUESTS, ("status",))
        self.adapter_loads = counter(ADAPTER_LOADS, ("adapter",))
        self.prefix_cache_queries = counter(PREFIX_CACHE_QUERIES)
        self.prefix_cache_hits = counter(PREFIX_CACHE_HITS)
        self.tenant_requests = counter(TENANT_REQUESTS, ("tenant", "adapter", "outcome"))
        self.tenant_tokens = {name: counter(name, ("tenant", "adapter")) for name in TENANT_TOKENS}
        self._recent_ttft: deque[tuple[float, float]] = deque(maxlen=10_000)
        self.recorder = BackgroundRecorder()
        self.startup_phases: dict[str, float] = {}
        counters = {
            PROMPT_TOKENS: self.prompt_tokens,
            GENERATION_TOKENS: self.generation_tokens,
            REQUESTS: self.requests,
            ADAPTER_LOADS: self.adapter_loads,
            PREFIX_CACHE_QUERIES: self.prefix_cache_queries,
            PREFIX_CACHE_HITS: self.prefix_cache_hits,
            TENANT_REQUESTS: self.tenant_requests,
            **self.tenant_tokens,
        }
        for name, extra in counters_at_start(labels.engine, adapters, tenants):
            self.recorder.submit(record_zero, counters[name], extra)

    def record_engine(self, stats: EngineStats) -> None:
        self.recorder.submit(self.queue_depth.set, stats.waiting)
        self.recorder.submit(self.running.set, stats.running)
        self.recorder.submit(self.kv_cache_usage.set, stats.kv_cache_usage)
        # Ray exports a gauge only while it is set (a value set once at start-up was gone from
        # the scrapes of a platform up for half an hour): the phases are set again with the queue.
        for phase, seconds in self.startup_phases.items():
            self.recorder.submit(self.replica_startup.set, seconds, {"phase": phase})

    def record_startup(self, phases: dict[str, float]) -> None:
        """This replica's start-up phases (`vllm_startup.startup_phases`), one gauge each,
        exported again with every engine report (`record_engine`)."""
        self.startup_phases = dict(phases)
        for phase, seconds in phases.items():
            self.recorder.submit(self.replica_startup.set, seconds, {"phase": phase})

    def record_status(self, status: int) -> None:
        self.recorder.submit(self.requests.inc, 1, {"status": str(status)})

    def record_adapter_load(self, adapter: str) -> None:
        self.recorder.submit(self.adapter_loads.inc, 1, {"adapter": adapter})

    def record_prefix_cache(self, queries: int, hits: int) -> None:
        self.recorder.submit(self.prefix_cache_queries.inc, queries)
        if hits:
            self.recorder.submit(self.prefix_cache_hits.inc, hits)

    def record_usage(self, usage: Any) -> None:
        """One engine request's use by its tenant (serving/api/usage.py's Usage)."""
        tags = {"tenant": usage.tenant, "adapter": usage.adapter}
        self.recorder.submit(self.tenant_requests.inc, 1, {**tags, "outcome": usage.outcome})
        for name, count in zip(
            TENANT_TOKENS, (usage.prompt_tokens, usage.cached_tokens, usage.output_tokens)
        ):
            if count:
                self.recorder.submit(self.tenant_tokens[name].inc, count, tags)

    def record_request(self, prompt_tokens: int, output_tokens: int, e2e_s: float) -> None:
        if prompt_tokens:
            self.recorder.submit(self.prompt_tokens.inc, prompt_tokens)
        if output_tokens:
            self.recorder.submit(self.generation_tokens.inc, output_tokens)
        self.recorder.submit(self.e2e.observe, e2e_s)

    def record_first_token(self, ttft_s: float) -> None:
        self.recorder.submit(self.ttft.observe, ttft_s)
        self._recent_ttft.append((time.monotonic(), ttft_s))

    def ttft_p50_ms(self, window_s: float = 60.0) -> float | None:
        """Median TTFT of this replica over the last `window_s` (for `llm-serving status`)."""
        since = time.monotonic() - window_s
        recent = [value for at, value in self._recent_ttft if at >= since]
        return round(statistics.median(recent) * 1000, 1) if recent else None

    def record_inter_token(self, gap_s: float) -> None:
        self.recorder.submit(self.itl.observe, gap_s)


def counter_values(text: str, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """A counter from a Prometheus text page (Ray's node endpoint prefixes `ray_`), summed by
    `labels`: e.g. prefix-cache hits by (model, replica) for `llm-serving status`."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {f"ray_{name}", name}
    sums: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                key = tuple(sample.labels.get(label, "") for label in labels)
                sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def prefix_cache_by_replica(text: str) -> dict[tuple[str, ...], tuple[float, float]]:
    """(model, replica) -> (prompt tokens looked up, tokens found) in the prefix cache."""
    labels = ("model", "replica")
    queries = counter_values(text, PREFIX_CACHE_QUERIES, labels)
    hits = counter_values(text, PREFIX_CACHE_HITS, labels)
    return {key: (value, hits.get(key, 0.0)) for key, value in queries.items()}


async def publish_engine_stats(
    read: Callable[[], EngineStats], metrics: PlatformMetrics, interval_s: float = 0.5
) -> None:
    """Copy the engine's queue into the gauges until cancelled (a replica background task)."""
    while True:
        with contextlib.suppress(Exception):  # an engine hiccup must never stop the replica
            metrics.record_engine(read())
        await asyncio.sleep(interval_s)

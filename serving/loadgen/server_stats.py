"""Server-side evidence: while a target is under load, read how many requests its engine runs at
once and how many wait, at a fixed interval. Sources: the platform's `/health` JSON (`running`,
`waiting`) and vLLM's Prometheus gauges on `/metrics` (plain `vllm serve`); a source for the
platform's own Prometheus metrics plugs in the same way once they exist."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

# A read of the platform's /health crosses the proxy and the replica: at 10 Hz it took about 12 % of
# a core from the engine under test on two cores (`top` during a c16 run). Once a second is enough
# to see how many requests ran at once.
STATS_INTERVAL_S = 1.0
MAX_SAMPLES = 20_000  # bounds memory and the loop (at 1 s: 5.5 h of polling per chunk)
TIMELINE_POINTS = 400  # what the report keeps of a timeline


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since polling started
    running: int
    waiting: int


class StatsSource(Protocol):
    # Read-only: the sources are frozen dataclasses.
    @property
    def name(self) -> str: ...

    async def read(self, http: httpx.AsyncClient) -> tuple[int, int] | None:
        """(running, waiting) now, or None when the server did not say."""


@dataclass(frozen=True)
class HealthSource:
    url: str
    name: str = "health"

    async def read(self, http: httpx.AsyncClient) -> tuple[int, int] | None:
        body = (await http.get(self.url)).json()
        if not isinstance(body, dict) or "running" not in body:
            return None
        return int(body["running"]), int(body.get("waiting") or 0)


@dataclass(frozen=True)
class PrometheusSource:
    url: str
    running_metric: str = "vllm:num_requests_running"
    waiting_metric: str = "vllm:num_requests_waiting"
    name: str = "prometheus"

    async def read(self, http: httpx.AsyncClient) -> tuple[int, int] | None:
        values = gauge_sums(
            (await http.get(self.url)).text, {self.running_metric, self.waiting_metric}
        )
        if self.running_metric not in values:
            return None
        return int(values[self.running_metric]), int(values.get(self.waiting_metric, 0))


def gauge_sums(text: str, names: set[str]) -> dict[str, float]:
    """Sum of each named metric over its label sets, from Prometheus text exposition."""
    sums: dict[str, float] = {}
    # Ray's endpoint exposes every metric of the node: parse only the lines of the wanted ones.
    prefixes = tuple(names)
    lines = [line for line in text.splitlines() if line.startswith(prefixes)]
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in names:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def detect_source(origin: str, timeout_s: float = 5.0) -> StatsSource | None:
    """The first source that answers with queue numbers at this server root, or None."""
    candidates: list[StatsSource] = [
        HealthSource(f"{origin}/health"),
        PrometheusSource(f"{origin}/metrics"),
    ]
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        for source in candidates:
            try:
                if await source.read(http) is not None:
                    return source
            except (httpx.HTTPError, ValueError):
                continue
    return None


@dataclass
class Poller:
    """Polls a source in the background between `start()` and `stop()`. The HTTP client is the
    caller's and stays open across polls, so no poll pays for a new connection."""

    source: StatsSource | None
    http: httpx.AsyncClient
    interval_s: float = STATS_INTERVAL_S
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    _task: asyncio.Task | None = None

    def start(self) -> None:
        if self.source is not None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        t0 = time.perf_counter()
        while len(self.samples) < MAX_SAMPLES:
            await self._poll_once(t0)
            await asyncio.sleep(self.interval_s)

    async def _poll_once(self, t0: float) -> None:
        assert self.source is not None
        try:
            reading = await self.source.read(self.http)
        except (httpx.HTTPError, ValueError):
            self.errors += 1
            return
        if reading is not None:
            self.samples.append(Sample(time.perf_counter() - t0, *reading))


def shifted(samples: list[Sample], offset: float) -> list[Sample]:
    return [Sample(s.t + offset, s.running, s.waiting) for s in samples]


def thin(samples: list[Sample], points: int = TIMELINE_POINTS) -> list[Sample]:
    """Every k-th sample: the report's timeline stays small; maxima come from all samples."""
    step = max(1, -(-len(samples) // points))
    return samples[::step]


def summarize_samples(source: str | None, samples: list[Sample], errors: int = 0) -> dict[str, Any]:
    """What the server said during a run; `batching` is True when it ran >1 request at once,
    None when it said nothing (no source, every poll failed, or no poll caught a request running:
    a level shorter than the poll interval says nothing about batching)."""
    running = [s.running for s in samples]
    busy = bool(running) and max(running) > 0
    return {
        "source": source,
        "samples": len(samples),
        "poll_errors": errors,
        "max_running": max(running, default=None),
        "mean_running": sum(running) / len(running) if running else None,
        "max_waiting": max((s.waiting for s in samples), default=None),
        "batching": (max(running) > 1) if busy else None,
        "timeline": [[round(s.t, 3), s.running, s.waiting] for s in thin(samples)],
    }

"""`GET /health` of an engine's app, the same on every route: 200 with the engine's queue and
start-up timings while it runs, 503 in the OpenAI error shape when it has died. `startup_s` holds
the engine's own timings and the named phases (`vllm_startup.STARTUP_PHASES`, first_token once a
request got one); `startup_at` the moments they are measured between (epoch seconds)."""

from __future__ import annotations

from typing import Any

from serving.api.errors import APIError
from serving.engines.vllm_startup import startup_phases
from serving.metrics import PlatformMetrics


def engine_unhealthy(err: Exception) -> APIError:
    return APIError(f"engine unhealthy: {err}", status=503, code="engine_unhealthy")


def health_body(engine: Any, metrics: PlatformMetrics | None) -> dict[str, Any]:
    stats = engine.stats()
    startup_at = getattr(engine, "startup_at", {})  # vLLM engines; the HF baseline has none
    return {
        "status": "ok",
        "model": engine.model_name,
        "running": stats.running,
        "waiting": stats.waiting,
        "kv_cache_usage": stats.kv_cache_usage,
        "aborted_total": stats.aborted_total,
        "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
        "ttft_p50_ms_1m": metrics.ttft_p50_ms() if metrics else None,
        "startup_s": {**engine.startup_timings, **startup_phases(startup_at)},
        "startup_at": {name: round(at, 3) for name, at in startup_at.items()},
    }

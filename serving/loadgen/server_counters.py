"""Platform counters read around a run: how many times each replica loaded each LoRA adapter
while the run's requests (warm-up included) were served, from the local platform's Prometheus
endpoint (Ray's node exporter). Targets that are not the local platform have no such counters."""

from __future__ import annotations

import time
from typing import Any

import httpx

from serving.loadgen.client import Target, auth_headers
from serving.metrics import ADAPTER_LOADS, counter_values

# Ray's metrics agent exports every RAY_metrics_report_interval_ms (2 s, serving.config.ray_env.ray_env):
# waiting a little longer makes the last loads of a run visible.
EXPORT_LAG_S = 5.0

Loads = dict[tuple[str, ...], float]


def local_metrics_url(targets: list[Target]) -> str | None:
    """The local platform's Prometheus endpoint when a target is that platform."""
    from serving.local.platform import load_state

    state = load_state()
    if state is None:
        return None
    origin = state.api_url.rstrip("/").removesuffix("/v1")
    return state.metrics_url if any(t.origin == origin for t in targets) else None


def adapter_ids(models_body: dict[str, Any]) -> set[str]:
    """The LoRA adapters of an OpenAI /models answer: vLLM's cards of adapters name a `parent`."""
    return {card["id"] for card in models_body.get("data", []) if card.get("parent")}


def requests_adapters(targets: list[Target], models: set[str]) -> bool:
    """Whether a requested model is an adapter of a target: only then are loads worth the wait."""
    for target in targets:
        try:
            body = httpx.get(f"{target.base_url}/models", headers=auth_headers(), timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return True  # unknown: count them rather than miss them
        if adapter_ids(body) & models:
            return True
    return False


def read_adapter_loads(metrics_url: str) -> Loads | None:
    """(adapter, model, replica) -> loads since each replica started; None when unreadable."""
    try:
        text = httpx.get(metrics_url, timeout=10).text
        return counter_values(text, ADAPTER_LOADS, ("adapter", "model", "replica"))
    except (httpx.HTTPError, ValueError):
        return None


def loads_during(before: Loads | None, metrics_url: str) -> list[dict[str, object]] | None:
    """Loads between `before` and now (after the export lag), one row per adapter and replica."""
    if before is None:
        return None
    time.sleep(EXPORT_LAG_S)
    after = read_adapter_loads(metrics_url)
    if after is None:
        return None
    rows = []
    for (adapter, model, replica), value in sorted(after.items()):
        loads = value - before.get((adapter, model, replica), 0.0)
        if loads > 0:
            rows.append(
                {"adapter": adapter, "model": model, "replica": replica, "loads": int(loads)}
            )
    return rows

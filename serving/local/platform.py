"""A local platform: a Ray head on this machine, Serve's HTTP proxy on loopback, every app deployed.

Apps are deployed as a RayService deploys them: the same Serve config document (serving.k8s),
PUT to the head's dashboard, so a changed config applied to a running platform (`apply`) restarts
only the apps whose own settings changed, and replica counts and autoscaling change in place.
`up` records the URLs in a small state file so `status`, `apply` and `down` find the platform."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from serving.config import PlatformConfig
from serving.config import apps as registry
from serving.config.ray_env import ray_env
from serving.k8s.serve_config import serve_config
from serving.local.leftovers import stop_leftovers
from serving.local.ray_access import (
    head_args,
    head_env,
    ray_auth_headers,
    running_head_is_loopback,
    single_machine,
    use_token_auth,
)
from serving.models import cache_root
from serving.tracing.backend import stop_local as stop_local_phoenix

RAY_NAMESPACE = "llm-serving"


class PlatformError(RuntimeError):
    """A local platform that cannot start or be reached; the message says why."""


@dataclass(frozen=True)
class Endpoints:
    api_url: str  # base URL of the OpenAI routes, e.g. http://127.0.0.1:8000/v1
    health_url: str
    dashboard_url: str
    metrics_url: str  # the Ray node's Prometheus endpoint
    model: str
    apps: list[str]
    # Defaults keep state files written before these fields loadable; None when the app is off.
    hf_url: str | None = None  # the transformers baseline's OpenAI routes, e.g. .../hf/v1
    analysis_url: str | None = None  # the analysis routes, e.g. .../analysis
    started_with: dict[str, Any] | None = None  # restart_settings() of the running platform
    served: list[str] | None = None  # every name `model` may take (models and adapters)


def restart_settings(config: PlatformConfig) -> dict[str, Any]:
    """The sections a running platform cannot change: the Ray head and Serve's proxy start with
    them (ports, CPUs, ingress environment)."""
    return config.model_dump(mode="json", include={"http", "ray"})


def check_applicable(running: Endpoints, config: PlatformConfig) -> None:
    """Refuse a config whose http/ray sections differ from the running platform's."""
    if running.started_with is None:  # a state file written before the field existed
        return
    new = restart_settings(config)
    changed = sorted(key for key in new if new[key] != running.started_with.get(key))
    if changed:
        raise PlatformError(
            f"changed {', '.join(changed)}: a running platform takes those only on a restart; "
            "run `llm-serving down`, then `llm-serving up` with the new config"
        )


def endpoints(config: PlatformConfig) -> Endpoints:
    http = f"http://{config.http.host}:{config.http.port}"
    prefix = config.vllm.route_prefix.rstrip("/")
    return Endpoints(
        api_url=f"{http}{prefix}/v1",
        health_url=f"{http}{prefix}/health",
        dashboard_url=f"http://{config.ray.dashboard_host}:{config.ray.dashboard_port}",
        metrics_url=f"http://127.0.0.1:{config.ray.metrics_export_port}/metrics",
        model=config.models[0].name if config.models else config.model.name,
        apps=[app.name for app in registry.apps_of(config) if getattr(config, app.name).enabled],
        hf_url=f"{http}{config.hf.route_prefix.rstrip('/')}/v1" if config.hf.enabled else None,
        analysis_url=(
            f"{http}{config.analysis.route_prefix.rstrip('/')}" if config.analysis.enabled else None
        ),
        started_with=restart_settings(config),
        served=served_names(config),
    )


def served_names(config: PlatformConfig) -> list[str]:
    """Names the OpenAI endpoint serves: each model, then its adapters."""
    if not config.models:
        return [config.model.name, *(a.name for a in config.vllm.adapters)]
    return [name for m in config.models for name in (m.name, *(a.name for a in m.adapters))]


def health_urls(config: PlatformConfig) -> list[str]:
    """The /health route of every enabled app: `up` is ready when all of them answer."""
    http = f"http://{config.http.host}:{config.http.port}"
    apps = (config.vllm, config.hf, config.analysis)
    return [f"{http}{app.route_prefix.rstrip('/')}/health" for app in apps if app.enabled]


def state_file() -> Path:
    return cache_root() / "platform.json"


def save_state(ep: Endpoints) -> None:
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps(asdict(ep), indent=2))


def load_state() -> Endpoints | None:
    try:
        return Endpoints(**json.loads(state_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None


def ray_executable() -> str:
    beside_python = Path(sys.executable).with_name("ray")
    return str(beside_python) if beside_python.exists() else (shutil.which("ray") or "ray")


def start_ray_head(config: PlatformConfig) -> None:
    cmd = [
        ray_executable(),
        "start",
        "--head",
        f"--num-cpus={config.ray.num_cpus}",
        "--include-dashboard=true",
        f"--dashboard-host={config.ray.dashboard_host}",
        f"--dashboard-port={config.ray.dashboard_port}",
        f"--metrics-export-port={config.ray.metrics_export_port}",
        "--disable-usage-stats",
        *head_args(config.http.host),
    ]
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        **ray_env(config),
        **head_env(config.http.host),
    }
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        if "already running" in output or "already in use" in output:
            raise PlatformError(
                "a local Ray cluster is already running; run `llm-serving down` first"
            )
        last = output.splitlines()[-1] if output else f"exit {done.returncode}"
        raise PlatformError(f"`ray start --head` failed: {last}")


def stop_ray() -> None:
    subprocess.run([ray_executable(), "stop", "--force"], capture_output=True, text=True)


def connect() -> None:
    """Join the local Ray head as a driver, with the install's token and the head's addressing."""
    use_token_auth()
    if running_head_is_loopback():
        single_machine()
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(
            address="auto",
            namespace=RAY_NAMESPACE,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except ConnectionError as err:
        raise PlatformError(f"cannot join the local Ray head: {err}") from None


def deploy(config: PlatformConfig, timeout_s: float = 600.0) -> None:
    """Deploy (or re-deploy) every enabled app and wait until all of them run. Serve compares
    each app's import path and args with what runs: an unchanged app keeps its replicas (new
    deployment options apply in place), a changed one rolls, an app left out is deleted."""
    document = serve_config(config, host=config.http.host)
    dashboard = f"http://{config.ray.dashboard_host}:{config.ray.dashboard_port}"
    put_serve_config(dashboard, document, timeout_s=min(timeout_s, DASHBOARD_WAIT_S))
    wait_deployed([app["name"] for app in document["applications"]], timeout_s)


DASHBOARD_WAIT_S = 60.0  # a head just started answers on its dashboard within seconds


def put_serve_config(dashboard_url: str, document: dict[str, Any], timeout_s: float) -> None:
    """PUT the document to Serve's REST API on the dashboard, as KubeRay and `serve deploy` do.
    Retries while the dashboard (or its Serve module) is still coming up."""
    url = f"{dashboard_url}/api/serve/applications/"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.put(url, json=document, headers=ray_auth_headers(), timeout=120)
            if response.status_code not in (404, 502, 503):  # not up yet: retried
                break
            last = f"HTTP {response.status_code}"
        except httpx.TransportError as err:
            last = type(err).__name__
        if time.monotonic() >= deadline:
            raise PlatformError(f"Ray's dashboard at {dashboard_url} took no config ({last})")
        time.sleep(1)
    if response.status_code != 200:
        cause = root_cause(response.text)
        raise PlatformError(f"deployment failed: Serve refused the config: {cause}")


def root_cause(message: str) -> str:
    """The exception line of a replica's start-up traceback (its last line), shortened."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no message")[:400]


def app_failures(apps: dict) -> list[str]:
    """`APP/DEPLOYMENT: cause` per deployment of a DEPLOY_FAILED app (`apps`: serve.status())."""
    failures = []
    for name, app in apps.items():
        if str(getattr(app.status, "value", app.status)) != "DEPLOY_FAILED":
            continue
        broken = {
            dname: dep
            for dname, dep in app.deployments.items()
            if "FAILED" in str(getattr(dep.status, "value", dep.status))
        }
        failures += [f"{name}/{dname}: {root_cause(dep.message)}" for dname, dep in broken.items()]
        if not broken:
            failures.append(f"{name}: {root_cause(app.message)}")
    return failures


def wait_deployed(names: list[str], timeout_s: float, poll_s: float = 2.0) -> None:
    """Until every app is RUNNING; a failed app (Serve gave up restarting its replicas) stops
    the wait at once with its replicas' error; the deadline bounds a replica that never starts."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        apps = {name: app for name, app in serve.status().applications.items() if name in names}
        failures = app_failures(apps)
        if failures:
            raise PlatformError(
                "a replica failed to start: "
                + "; ".join(failures)
                + " (replica logs: /tmp/ray/session_latest/logs/serve/)"
            )
        states = {name: str(getattr(app.status, "value", app.status)) for name, app in apps.items()}
        if len(states) == len(names) and set(states.values()) == {"RUNNING"}:
            return
        if time.monotonic() >= deadline:
            raise PlatformError(f"apps not running after {timeout_s:.0f}s: {states}")
        time.sleep(poll_s)


def wait_healthy(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as err:
            last = type(err).__name__
        time.sleep(1)
    raise PlatformError(f"{url} not healthy after {timeout_s:.0f}s ({last})")


def shutdown(drain: bool = True) -> None:
    """Stop Serve and the local Ray head; safe to call when nothing runs. `drain`: replicas finish
    their requests first (up to their graceful_shutdown_timeout_s, by default the drain
    deadline); without, Ray stops at once (a failed `up`, which served nothing: a replica stuck
    in its constructor would otherwise hold the stop for the whole deadline)."""
    if drain:
        try:
            import ray
            from ray import serve

            connect()
            serve.shutdown()
            ray.shutdown()  # disconnect before `ray stop`, or the driver reports a dead raylet
        except Exception:  # nothing to shut down, or Ray already gone: `ray stop` below still runs
            pass
    stop_ray()
    stop_leftovers()  # Serve's HAProxy (after a drain, serve.shutdown stopped it), orphaned engines
    stop_local_phoenix()  # the trace backend of `up --tracing`, if it runs
    state_file().unlink(missing_ok=True)


def serve_status() -> dict:
    """Applications and deployments as Serve reports them."""
    from ray import serve

    connect()
    status = serve.status()
    apps = {}
    for name, app in status.applications.items():
        apps[name] = {
            "status": str(app.status.value if hasattr(app.status, "value") else app.status),
            "deployments": {
                dname: {
                    "status": str(getattr(dep.status, "value", dep.status)),
                    "replicas": {
                        str(getattr(state, "value", state)): n
                        for state, n in dep.replica_states.items()
                    },
                }
                for dname, dep in app.deployments.items()
            },
        }
    return apps


def engine_health_urls(ep: Endpoints) -> dict[str, str]:
    """Health routes of the engine apps (they report the engine's queue)."""
    urls = {"vllm": ep.health_url} if "vllm" in ep.apps else {}
    if ep.hf_url:
        urls["hf"] = ep.hf_url.removesuffix("/v1") + "/health"
    return urls


def prefix_caches(metrics_url: str) -> list[dict[str, Any]]:
    """Each vLLM replica's prefix-cache hit rate, from the node's Prometheus endpoint (Ray exports
    every few seconds); [] while it has none or cannot be read."""
    from serving.metrics import prefix_cache_by_replica

    try:
        text = httpx.get(metrics_url, timeout=5).text
        rows = prefix_cache_by_replica(text)
    except (httpx.HTTPError, ValueError):
        return []
    return [
        {
            "model": model,
            "replica": replica,
            "queries": queries,
            "hits": hits,
            "hit_rate": hits / queries,
        }
        for (model, replica), (queries, hits) in sorted(rows.items())
        if queries
    ]


def engine_health(url: str) -> dict:
    try:
        return httpx.get(url, timeout=5).json()
    except (httpx.HTTPError, ValueError) as err:
        return {"status": f"unreachable ({type(err).__name__})"}

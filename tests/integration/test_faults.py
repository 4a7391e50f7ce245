"""Faults on the CPU with the tiny model, each bounded in time: a client that leaves stops costing
compute, a killed replica is replaced with no request hanging, a scale-down lets every open stream
finish, and an engine that cannot start makes `llm-serving up` fail fast with its cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from filelock import FileLock

from serving.config import PlatformConfig, parse_config
from serving.config.ray_env import drain_deadline_s
from serving.deployments.replica import replica_actor_options
from serving.deployments.vllm_server import VLLMServer, build_vllm_app
from serving.engines.vllm import vllm_env
from serving.local.platform import ray_executable
from serving.models import resolve_model
from tests.integration.conftest import (
    CLI,
    MODEL,
    ROOT,
    SESSION_LOCK,
    Platform,
    extra_app,
    free_port,
)
from tests.integration.streams import open_streams, wait_until

ABORT_BOUND_S = 2.0  # the bound: running requests back to 0 within 2 s of the disconnect
LONG = {"model": MODEL, "prompt": "Tell a long story", "ignore_eos": True}


def tiny_vllm_config(prefix: str, **vllm: object) -> PlatformConfig:
    return parse_config(
        {
            "model": {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"},
            "vllm": {
                "route_prefix": prefix,
                "engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 16},
                **vllm,
            },
        }
    )


def replica_pids(app: str) -> dict[str, int]:
    """Live replica actors of a Serve app -> PID (Ray's state API)."""
    from ray.util.state import list_actors

    actors = list_actors(
        filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False
    )
    prefix = f"ServeReplica:{app}:"
    return {a.actor_id: a.pid for a in actors if (a.class_name or "").startswith(prefix)}


def replica_states(app: str) -> dict[str, int]:
    from ray import serve

    return dict(serve.status().applications[app].deployments["VLLMServer"].replica_states)


# -- a client disconnects mid-stream ---------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "/hf"], ids=["vllm", "hf"])
def test_client_disconnect_frees_the_engine_within_2s(platform: Platform, prefix: str) -> None:
    health_url = f"{platform.url}{prefix}/health"
    url = f"{platform.url}{prefix}/v1/completions"
    with httpx.Client(timeout=30) as http:
        before = http.get(health_url).json()["aborted_total"]
        body = {**LONG, "max_tokens": 900, "stream": True}
        with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert http.get(health_url).json()["running"] == 1  # the engine works on it now
        # Leaving the `with` closed the connection mid-stream.

        def freed() -> bool:
            health = http.get(health_url).json()
            return health["running"] == 0 and health["aborted_total"] > before

        freed_s = wait_until(freed, timeout_s=30, poll_s=0.05)
        health = http.get(health_url).json()
    print(f"\n{prefix or '/'} disconnect: engine idle {freed_s}s after the client left; {health}")
    assert freed_s is not None, health
    assert freed_s <= ABORT_BOUND_S
    assert health["aborted_total"] == before + 1 and health["waiting"] == 0


# -- a replica process is killed under load --------------------------------------------------------


def answers(url: str) -> bool:
    try:
        body = {"model": MODEL, "prompt": "ok", "max_tokens": 2}
        response = httpx.post(url, json=body, timeout=10)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def test_killed_replica_is_replaced_and_no_request_hangs(platform: Platform) -> None:
    app, prefix = "faults-kill", "/faults-kill"
    url = f"{platform.url}{prefix}/v1/completions"
    with extra_app(app, prefix, build_vllm_app(tiny_vllm_config(prefix))):
        ((old_id, old_pid),) = replica_pids(app).items()
        old_tree = [old_pid] + [c.pid for c in psutil.Process(old_pid).children(recursive=True)]
        streams = open_streams(url, {**LONG, "max_tokens": 900}, count=4)
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        outcomes = [s.wait(timeout_s=120) for s in streams]
        waited = wait_until(lambda: answers(url), timeout_s=300, poll_s=0.5)
        recovered_s = None if waited is None else time.monotonic() - killed_at
        new = replica_pids(app)
        orphans_gone_s = wait_until(
            lambda: not any(psutil.pid_exists(pid) for pid in old_tree), timeout_s=60, poll_s=0.5
        )
    ended = [round(o.ended_at - killed_at, 1) for o in outcomes]
    print(
        f"\nreplica kill: in-flight {[o.kind for o in outcomes]} ended {ended}s after the kill; "
        f"serving again {recovered_s}s after the kill; "
        f"old engine processes gone after {orphans_gone_s}s; "
        f"details {[o.detail for o in outcomes]}"
    )
    assert all(o.kind in {"error_event", "http_error", "broken"} for o in outcomes), outcomes
    assert recovered_s is not None, "no answer within 300 s of the kill"
    assert len(new) == 1 and old_id not in new  # a new replica serves, not the killed one
    assert orphans_gone_s is not None, "the killed replica's engine processes outlived it"


# -- scale-down while streams are open -------------------------------------------------------------


def scaled_app(config: PlatformConfig, num_replicas: int):
    """The same deployment with another replica count. `serve.run` gives it a new random code
    version, so Serve replaces the replicas: the old ones drain while the new one starts."""
    options = config.vllm.replica_options(drain_deadline_s(config)) | {"num_replicas": num_replicas}
    return VLLMServer.options(
        **options, ray_actor_options=replica_actor_options(config.vllm.resources, vllm_env(config))
    ).bind(config.model_dump(mode="json"))


def test_scale_down_lets_every_open_stream_finish(platform: Platform) -> None:
    from ray import serve

    # The streams must end within the test platform's 30 s HAProxy hard stop after the reload the
    # scale-down causes (test_long_streams.py tests that stop): 300 tokens took over 30 s on a
    # loaded 2-core CI machine, and the old HAProxy cut all eight.
    app, prefix, tokens = "faults-drain", "/faults-drain", 120
    config = tiny_vllm_config(prefix)
    grace_s = config.vllm.replica_options(drain_deadline_s(config))["graceful_shutdown_timeout_s"]
    assert grace_s >= 60  # the drain deadline, longer than Serve's 20 s default
    url = f"{platform.url}{prefix}/v1/completions"
    with extra_app(app, prefix, scaled_app(config, 2)):
        assert replica_states(app) == {"RUNNING": 2}
        streams = open_streams(url, {**LONG, "max_tokens": tokens}, count=8)
        assert not any(s.outcome for s in streams), "a stream ended before the scale-down"
        asked_at = time.monotonic()
        seen_stopping: list[float] = []
        with ThreadPoolExecutor(1) as pool:
            update = pool.submit(serve.run, scaled_app(config, 1), name=app, route_prefix=prefix)

            def scaled_down() -> bool:
                states = replica_states(app)
                if states.get("STOPPING"):
                    seen_stopping.append(time.monotonic() - asked_at)
                return states == {"RUNNING": 1}

            gone_s = wait_until(scaled_down, timeout_s=300, poll_s=0.25)
            update.result(timeout=300)
        outcomes = [s.wait(timeout_s=120) for s in streams]
    last_end = max(o.ended_at for o in outcomes) - asked_at
    stopping = f"{seen_stopping[0]:.1f}-{seen_stopping[-1]:.1f}s" if seen_stopping else "never"
    print(
        f"\nscale-down 2->1 with 8 open streams: {[o.kind for o in outcomes]}, tokens "
        f"{sorted({o.tokens for o in outcomes})}; a replica was STOPPING {stopping} after the "
        f"request, gone at {gone_s}s; last stream ended at {last_end:.1f}s"
    )
    assert gone_s is not None, "never scaled down to one replica"
    assert seen_stopping, "no replica was ever seen draining"
    assert all(o.kind == "completed" and o.finish_reason == "length" for o in outcomes), outcomes
    assert all(o.tokens == tokens for o in outcomes), [o.tokens for o in outcomes]


# -- the engine cannot start -----------------------------------------------------------------------


def broken_model(tmp_path: Path, how: str) -> Path:
    """A copy of the tiny model whose weights no engine can load."""
    model = tmp_path / f"broken-{how}"
    subprocess.run(["cp", "-r", str(resolve_model(MODEL)), str(model)], check=True)
    if how == "corrupt-weights":  # an unreadable file: caught before Ray starts
        (model / "model.safetensors").write_bytes(os.urandom(4096))
    else:  # readable weights of the wrong shape: only an engine finds out
        config = json.loads((model / "config.json").read_text())
        config["intermediate_size"] *= 2
        (model / "config.json").write_text(json.dumps(config))
    return model


def up_with(
    tmp_path: Path, model_ref: str, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess, float]:
    config = {
        "model": {"ref": model_ref, "max_model_len": 1024, "dtype": "float32"},
        "http": {"host": "127.0.0.1", "port": free_port()},
        "ray": {"num_cpus": 8, "dashboard_port": free_port(), "metrics_export_port": free_port()},
        "vllm": {"engine": {"kv_cache_memory_gb": 0.25}},
        "analysis": {"enabled": False},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    done = subprocess.run(
        [*CLI, "up", "--detach", "--config", str(path), "--timeout", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    return done, time.monotonic() - started


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("how", ["missing", "corrupt-weights"])
def test_bad_model_path_fails_before_ray_starts(tmp_path: Path, how: str) -> None:
    ref = str(tmp_path / "nowhere") if how == "missing" else str(broken_model(tmp_path, how))
    done, took = up_with(tmp_path, ref, {})
    print(f"\nup with a {how} model: exit {done.returncode} after {took:.1f}s: {error_lines(done)}")
    assert done.returncode == 1, done.stderr
    assert len(error_lines(done)) == 1 and ref in error_lines(done)[0]
    assert "starting Ray" not in done.stdout


def serve_haproxy_processes() -> list[int]:
    import psutil

    from serving.local.leftovers import is_serve_haproxy

    procs = psutil.process_iter(["name", "cmdline"])
    return [p.pid for p in procs if is_serve_haproxy(p.info["name"] or "", p.info["cmdline"] or [])]


def test_engine_that_cannot_start_fails_up_with_its_cause(tmp_path: Path) -> None:
    """Weights that parse but do not fit the model: every engine replica fails in its constructor.
    Starts its own Ray head, so it runs before the session platform (see conftest ordering)."""
    model = broken_model(tmp_path, "wrong-shape")
    # One constructor attempt per replica instead of Serve's 3 keeps the test short.
    with FileLock(str(SESSION_LOCK), timeout=3600):
        done, took = up_with(tmp_path, str(model), {"RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1"})
        leftover = subprocess.run(
            [ray_executable(), "status"], capture_output=True, text=True, timeout=60
        )
    errors = error_lines(done)
    print(
        f"\nup with an engine that cannot start: exit {done.returncode} after {took:.0f}s: {errors}"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(errors) == 1, done.stderr
    assert "failed to start" in errors[0]
    # `up` stops at the first deployment Serve gives up on, naming it and its exception.
    assert "VLLMServer" in errors[0] or "HFBaseline" in errors[0], errors[0]
    assert "Error" in errors[0] and "replica logs" in errors[0], errors[0]
    assert leftover.returncode != 0  # `up` stopped the Ray head it started
    assert not serve_haproxy_processes()  # and its HAProxy, which `ray stop` leaves running

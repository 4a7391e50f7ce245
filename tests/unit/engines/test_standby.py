"""The standby worker's parts that need no Ray cluster: the replica's runtime env carries Ray's
setup hook (named as Ray names it) only when the config keeps a standby, and the hook never fails
a worker. That the raylet reuses the standby is checked on the real platform
(tests/integration/test_cold_start.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ray._private import ray_constants

from serving.config import PlatformConfig
from serving.deployments.vllm_server import build_vllm_app, replica_env
from serving.engines import standby


def test_the_hook_variable_is_rays_own() -> None:
    assert standby.SETUP_HOOK_ENV == ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR


def test_replicas_run_the_import_hook_when_a_standby_is_kept() -> None:
    env = replica_env(PlatformConfig())
    assert env[standby.SETUP_HOOK_ENV] == "serving.engines.standby.import_replica_modules"
    assert env["VLLM_NO_USAGE_STATS"] == "1"  # vLLM's own variables stay


def test_no_hook_without_a_standby() -> None:
    config = PlatformConfig.model_validate({"vllm": {"engine": {"standby_worker_s": 0}}})
    assert standby.SETUP_HOOK_ENV not in replica_env(config)


def test_the_deployment_carries_the_hook_in_its_runtime_env() -> None:
    app = build_vllm_app(PlatformConfig())
    options = app._bound_deployment.ray_actor_options
    assert options["runtime_env"]["env_vars"][standby.SETUP_HOOK_ENV] == standby.SETUP_HOOK


def test_the_hook_imports_what_it_can_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(standby, "modules_file", lambda: tmp_path / "none-recorded.txt")
    monkeypatch.setattr(standby, "REPLICA_MODULES", ("json", "serving.no_such_module"))
    standby.import_replica_modules()
    assert "json" in sys.modules
    assert "serving.no_such_module" in caplog.text


def test_a_replicas_recorded_modules_are_what_the_next_standby_imports(tmp_path: Path) -> None:
    import email.mime.text  # a module loaded from a file
    import math  # no file in most builds: not recorded when it has none

    path = tmp_path / "cache" / standby.MODULES_FILE
    loaded = {"email.mime.text": email.mime.text, "math": math, "builtins": __builtins__}
    standby.record_replica_modules(path, loaded)
    expected = ["email.mime.text"] + (["math"] if getattr(math, "__file__", None) else [])
    assert standby.modules_to_import(path) == expected
    assert list(path.parent.iterdir()) == [path]  # no partial file left behind


def test_before_any_record_the_built_in_list_is_imported(tmp_path: Path) -> None:
    assert standby.modules_to_import(tmp_path / "missing.txt") == list(standby.REPLICA_MODULES)


def test_every_replica_module_exists() -> None:
    import importlib.util

    missing = [m for m in standby.REPLICA_MODULES if importlib.util.find_spec(m) is None]
    assert missing == []


async def test_the_standby_is_asked_for_once_the_engine_is_idle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The standby's imports would share the cores with the requests that woke the replica."""
    asked: list[tuple[int, int]] = []
    in_flight = iter([2, 1, 0])  # the engine drains its first requests
    seen: list[int] = []

    def count() -> int:
        seen.append(next(in_flight))
        return seen[-1]

    monkeypatch.setattr(standby, "modules_file", lambda: tmp_path / standby.MODULES_FILE)
    monkeypatch.setattr(standby, "prestart_standby", lambda keep: asked.append((keep, seen[-1])))
    await standby.leave_standby(600, count, settle_s=0, poll_s=0)
    assert asked == [(600, 0)]  # asked once, after the engine reported none in flight
    assert (tmp_path / standby.MODULES_FILE).read_text().count("\n") > 100  # what it imported


async def test_a_refused_standby_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    def refuse(keep: int) -> None:
        raise ConnectionError("raylet unreachable")

    monkeypatch.setattr(standby, "modules_file", lambda: tmp_path / standby.MODULES_FILE)
    monkeypatch.setattr(standby, "prestart_standby", refuse)
    await standby.leave_standby(600, lambda: 0, settle_s=0, poll_s=0)
    assert "raylet unreachable" in caplog.text

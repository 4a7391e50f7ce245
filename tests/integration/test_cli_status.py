"""`llm-serving status` against the running test platform."""

from __future__ import annotations

import json

from tests.integration.conftest import Platform, run_cli


def test_status_shows_running_apps_and_the_engine_queue(platform: Platform) -> None:
    result = run_cli("status", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["apps"]["vllm"]["status"] == "RUNNING"
    replicas = status["apps"]["vllm"]["deployments"]["VLLMServer"]["replicas"]
    assert replicas.get("RUNNING") == 1
    assert status["engine"]["status"] == "ok"


def test_second_up_refuses_while_one_runs(platform: Platform) -> None:
    result = run_cli("up", "--detach", "--config", str(platform.config_path), timeout=300)
    assert result.returncode == 1
    assert "already running" in result.stderr
    assert "Traceback" not in result.stderr

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
    assert status["engines"]["vllm"]["status"] == "ok"
    assert status["engines"]["hf"]["status"] == "ok"
    assert status["engines"]["vllm"]["waiting"] == 0


def test_second_up_refuses_while_one_runs(platform: Platform) -> None:
    result = run_cli("up", "--detach", "--config", str(platform.config_path), timeout=300)
    assert result.returncode == 1
    assert "already running" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_text_lists_queue_and_ttft_per_engine(platform: Platform) -> None:
    platform.client().completions.create(model=platform.model, prompt="hi", max_tokens=2)
    result = run_cli("status", timeout=120)
    assert result.returncode == 0, result.stderr
    engine_line = {}
    app = None
    for line in result.stdout.splitlines():
        if not line.startswith(" "):
            app = line.split(":")[0]
        elif line.strip().startswith("engine:"):
            engine_line[app] = line
    assert set(engine_line) == {"vllm", "hf"}
    assert "queue=0" in engine_line["vllm"]
    assert "ttft_p50_1m=-" not in engine_line["vllm"]  # the request above was measured

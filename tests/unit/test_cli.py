"""CLI errors are one line and a non-zero exit, never a traceback; nothing starts on bad input."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from serving.cli import apply_overrides, main
from serving.config import PlatformConfig


def test_bad_config_exits_2_with_the_field_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("vllm:\n  num_replicas: zero\n")
    result = CliRunner().invoke(main, ["up", "--config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: invalid config")
    assert "vllm.num_replicas" in result.output
    assert "Traceback" not in result.output


def test_missing_model_exits_1_before_starting_anything() -> None:
    result = CliRunner().invoke(main, ["up", "--model", "/nonexistent/model-dir"])
    assert result.exit_code == 1
    assert "error: model '/nonexistent/model-dir': no such directory" in result.output
    assert "starting Ray" not in result.output


def test_status_without_a_platform_says_how_to_start(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "llm-serving up" in result.output


def test_overrides_replace_model_and_port() -> None:
    config = apply_overrides(PlatformConfig(), "tiny-qwen2", 9001)
    assert (config.model.ref, config.model.name, config.http.port) == ("tiny-qwen2", "tiny-qwen2", 9001)

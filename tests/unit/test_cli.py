"""CLI errors are one line and a non-zero exit, never a traceback; nothing starts on bad input;
`up` prints the URL of every enabled app."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from serving.cli import apply_overrides, main
from serving.config import PlatformConfig

REPO = Path(__file__).resolve().parents[2]


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
    assert (config.model.ref, config.model.name, config.http.port) == (
        "tiny-qwen2",
        "tiny-qwen2",
        9001,
    )


def test_up_writes_the_serve_config_a_later_apply_of_the_same_file_writes(tmp_path: Path) -> None:
    """Serve hashes each app's args into its code version: any difference between what `up` and
    `apply` write for one file restarts every app on that apply (it did: `up` wrote defaults)."""
    from serving.config import load_config
    from serving.k8s.serve_config import serve_config

    path = tmp_path / "platform.yaml"
    path.write_text("model:\n  ref: tiny-qwen2\nvllm:\n  engine:\n    max_num_seqs: 8\n")
    applied = serve_config(load_config(path), host="127.0.0.1")
    assert serve_config(apply_overrides(load_config(path), None, None), host="127.0.0.1") == applied
    moved = apply_overrides(load_config(path), "tiny-qwen2", 9001)
    apps = serve_config(moved, host="127.0.0.1")["applications"]
    assert apps == applied["applications"]  # the same model on another port: the same apps
    assert moved.http.port == 9001 and moved.vllm.engine.max_num_seqs == 8


def test_ready_message_prints_every_enabled_app(capsys) -> None:
    from serving.cli import print_ready
    from serving.local.platform import endpoints

    print_ready(endpoints(PlatformConfig()))
    out = capsys.readouterr().out
    assert "OpenAI API     http://127.0.0.1:8000/v1" in out
    assert "HF baseline    http://127.0.0.1:8000/hf/v1" in out
    assert "analysis       http://127.0.0.1:8000/analysis" in out
    off = PlatformConfig.model_validate({"hf": {"enabled": False}, "analysis": {"enabled": False}})
    assert (endpoints(off).hf_url, endpoints(off).analysis_url) == (None, None)


def test_state_file_from_before_the_app_urls_still_loads(tmp_path: Path, monkeypatch) -> None:
    from serving.local.platform import load_state, state_file

    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    old = {
        "api_url": "a",
        "health_url": "h",
        "dashboard_url": "d",
        "metrics_url": "m",
        "model": "tiny-qwen2",
        "apps": ["vllm"],
    }
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps(old))
    ep = load_state()
    assert ep is not None and ep.api_url == "a" and ep.hf_url is None


def test_apply_without_a_platform_says_how_to_start(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    path = tmp_path / "platform.yaml"
    path.write_text("vllm:\n  autoscaling: {max_replicas: 2}\n")
    result = CliRunner().invoke(main, ["apply", "--config", str(path)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: no platform is running here; start one with `llm-serving up`"
    )


def test_apply_refuses_a_new_port_before_touching_the_platform(tmp_path: Path, monkeypatch) -> None:
    from serving.local import platform as local

    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    local.save_state(local.endpoints(PlatformConfig()))
    monkeypatch.setattr(local, "deploy", lambda *_: (_ for _ in ()).throw(AssertionError("ran")))
    path = tmp_path / "platform.yaml"
    path.write_text("http: {port: 9100}\n")
    result = CliRunner().invoke(main, ["apply", "--config", str(path)])
    assert result.exit_code == 1
    assert "error: changed http: a running platform takes those only on a restart" in result.output
    assert "llm-serving down" in result.output


def refuse_to_run(*_: object) -> None:
    raise AssertionError("ran")


def test_up_refuses_runtime_adapters_without_keys_before_ray_starts(monkeypatch) -> None:
    """The shipped multi-model example without LLM_SERVING_API_KEYS: one line naming the setting,
    before any model is prepared or Ray started (the router would refuse it minutes later)."""
    from serving.local import platform as local

    monkeypatch.delenv("LLM_SERVING_API_KEYS", raising=False)
    monkeypatch.setattr(local, "start_ray_head", refuse_to_run)
    monkeypatch.setattr("serving.cli.resolve_model", refuse_to_run)
    example = str(REPO / "serving" / "examples" / "multi-model.yaml")
    result = CliRunner().invoke(main, ["up", "--config", example])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: models[1].runtime_adapters needs API")
    assert "auth.api_keys_env" in lines[0] and "LLM_SERVING_API_KEYS" in lines[0]


def test_up_with_the_key_gets_past_the_check(monkeypatch) -> None:
    from serving.local import platform as local

    monkeypatch.setenv("LLM_SERVING_API_KEYS", "change-me")
    monkeypatch.setattr(local, "start_ray_head", refuse_to_run)
    monkeypatch.setattr("serving.cli.resolve_model", refuse_to_run)
    example = str(REPO / "serving" / "examples" / "multi-model.yaml")
    result = CliRunner().invoke(main, ["up", "--config", example])
    assert isinstance(result.exception, AssertionError)  # went on to prepare the models

"""`llm-serving analyze ...` through click's CliRunner: tables, --json, one-line errors."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from serving.cli import main

QWEN_CONFIG = str(resources.files("serving").joinpath("data/qwen2.5-0.5b-config.json"))


def analyze(*args: str) -> Result:
    return CliRunner().invoke(main, ["analyze", *args])


def test_config_only_reports_qwen25_numbers() -> None:
    result = analyze("config", "--config-only", QWEN_CONFIG)
    assert result.exit_code == 0, result.output
    assert "494,032,768" in result.output
    assert "12,288 bytes/token (bfloat16)" in result.output
    assert "2 (GQA: 7 query heads per KV head)" in result.output


def test_config_only_json() -> None:
    result = analyze("config", "--config-only", QWEN_CONFIG, "--json")
    report = json.loads(result.stdout)
    assert report["parameters"]["total"] == 494_032_768
    assert report["architecture"]["rope_theta"] == 1_000_000.0


def test_kv_cache_json_totals() -> None:
    result = analyze(
        "kv-cache", "--config-only", QWEN_CONFIG, "--tokens", "32768", "--batch", "8", "--json"
    )
    report = json.loads(result.stdout)
    assert report["bytes_per_token"] == 12_288
    assert report["total_bytes"] == 12_288 * 32_768 * 8
    assert report["saving"]["factor"] == 7


def test_kv_cache_table() -> None:
    result = analyze("kv-cache", "--config-only", QWEN_CONFIG, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert "24,576 = 2 x 24 layers x 2 kv_heads x 64 head_dim x 4 bytes" in result.output


def test_attention_layers_table_shows_gqa_shapes() -> None:
    result = analyze("attention-layers", "--config-only", QWEN_CONFIG)
    assert result.exit_code == 0, result.output
    row = result.output.splitlines()[2].split()
    assert row[:5] == ["0", "896x896+b", "128x896+b", "128x896+b", "896x896"]
    assert row[5:9] == ["14", "2", "7", "64"]


def test_modules_on_tiny_model() -> None:
    result = analyze("modules", "--model", "tiny-qwen2", "--depth", "2", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["model.embed_tokens"]["weights"] == {"weight": [49152, 448]}
    assert "model.layers.0" not in rows  # depth 3


def test_attention_json_and_table_on_tiny_model() -> None:
    result = analyze(
        "attention",
        "--model",
        "tiny-qwen2",
        "--prompt",
        "The capital of France",
        "--layers",
        "1",
        "--heads",
        "0,2",
        "--json",
    )
    report = json.loads(result.stdout)
    assert report["layers"] == [1] and [h["head"] for h in report["attention"][0]["heads"]] == [
        0,
        2,
    ]
    table = analyze(
        "attention", "--model", "tiny-qwen2", "--prompt", "Paris", "--layers", "0", "--heads", "3"
    )
    assert "layer 0 head 3" in table.output and "1.000" in table.output


def test_attention_html_writes_bertviz_page(tmp_path: Path) -> None:
    out = tmp_path / "view.html"
    result = analyze(
        "attention", "--model", "tiny-qwen2", "--prompt", "Hello world", "--html", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "bertviz-" in out.read_text()


@pytest.mark.parametrize("command", ["generation-trace", "trace"])
def test_generation_trace_both_modes(command: str) -> None:
    result = analyze(
        command,
        "--model",
        "tiny-qwen2",
        "--prompt",
        "hello there",
        "--max-new-tokens",
        "3",
        "--json",
    )
    traces = json.loads(result.stdout)
    assert [t["mode"] for t in traces] == ["no-cache", "kv-cache"]
    assert all(len(t["latencies_ms"]) == 3 for t in traces)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["config", "--config-only", "/no/such/config.json"], "does not exist"),
        (["kv-cache", "--config-only", QWEN_CONFIG, "--dtype", "int4"], "allowed: float32"),
        (["kv-cache", "--config-only", QWEN_CONFIG, "--tokens", "0"], "tokens must be positive"),
        (
            ["attention", "--model", "tiny-qwen2", "--prompt", "hi", "--layers", "9"],
            "allowed: 0..1",
        ),
        (
            ["attention", "--model", "tiny-qwen2", "--prompt", "hi", "--heads", "a,b"],
            "comma-separated",
        ),
        (["config", "--model", "./no-such-model-dir"], "no such directory"),
    ],
)
def test_errors_are_one_line_without_traceback(args: list[str], needle: str) -> None:
    result = analyze(*args)
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in result.output


def test_config_only_with_unreadable_json(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{")
    result = analyze("config", "--config-only", str(bad))
    assert result.exit_code == 2 and "cannot read model config" in result.stderr

"""`llm-serving bench seed` for real on the tiny model: transformers and the vLLM engine
in-process, every experiment measured, the report written. Checks the figures are consistent,
never how fast anything was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import MODEL, run_cli

NEW_TOKENS, BATCHES = 6, (2, 4)


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    out = tmp_path_factory.mktemp("seed")
    config = out / "platform.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"},
                "vllm": {"engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 16}},
            }
        )
    )
    done = run_cli(
        "bench",
        "seed",
        "--config",
        str(config),
        "--output-len",
        str(NEW_TOKENS),
        "--batch-sizes",
        ",".join(map(str, BATCHES)),
        "--repeats",
        "1",
        "--output",
        str(out / "report"),
        timeout=900,
    )
    return done.returncode, done.stdout + done.stderr, out / "report"


def test_every_experiment_is_measured(seed_run: tuple[int, str, Path]) -> None:
    code, output, out = seed_run
    assert code == 0, output[-3000:]
    doc = json.loads((out / "result.json").read_text())
    one = doc["one_prompt"]
    assert one["speedup"] == pytest.approx(one["hf_generate_s"] / one["vllm_s"])
    for mode in ("no-cache", "kv-cache"):
        assert len(doc["kv_cache"][mode]["latencies_ms"]) == NEW_TOKENS
    four = doc["four_prompts"]
    assert four["speedup"] == pytest.approx(four["one_by_one_s"] / four["batched_s"])
    rows = {(r["engine"], r["batch"]) for r in doc["batch_efficiency"]}
    assert rows == {(e, b) for e in ("hf", "vllm") for b in (1, *BATCHES)}


def test_static_batch_waste_is_counted_from_the_real_batch(seed_run: tuple[int, str, Path]) -> None:
    _, _, out = seed_run
    waste = json.loads((out / "result.json").read_text())["static_batch_waste"]
    lengths = waste["prompt_tokens"]
    assert len(set(lengths)) > 1  # the seed's prompts differ in length: padding is real
    assert waste["padding_waste"] == pytest.approx(
        sum(max(lengths) - n for n in lengths) / (max(lengths) * len(lengths))
    )
    assert 0 < waste["idle_waste"] < 1 and waste["expected_speedup"] > 0


def test_report_and_plot_are_written(seed_run: tuple[int, str, Path]) -> None:
    _, output, out = seed_run
    for line in ("a. one prompt", "b. KV cache", "c. 4 prompts", "d. largest batch", "e. static"):
        assert line in output and line in (out / "summary.md").read_text()
    assert (out / "seed.png").read_bytes()[:4] == b"\x89PNG"

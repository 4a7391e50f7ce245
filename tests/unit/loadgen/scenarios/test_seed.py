"""The seed suite's arithmetic (padding and idle slots, the expected batching speedup) and its
report on a recorded document; the real run is tests/integration/test_seed_suite.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.loadgen.report import write_report
from serving.loadgen.scenarios import seed as seed_suite
from serving.loadgen.scenarios import seed_report


def test_padding_slots_count_pads_up_to_the_longest_prompt() -> None:
    assert seed_suite.padding_slots([3, 5, 5, 7]) == (4 + 2 + 2, 28)
    assert seed_suite.padding_slots([6, 6]) == (0, 12)


def test_idle_slots_count_steps_after_each_row_is_done() -> None:
    assert seed_suite.idle_slots([8, 16, 24, 32]) == (24 + 16 + 8, 128)


def test_expected_speedup_is_rows_times_useful_work_over_step_cost() -> None:
    assert seed_suite.expected_speedup(4, 1.0, 1.0) == 4
    assert seed_suite.expected_speedup(4, 0.625, 2.0) == pytest.approx(1.25)


def test_batch_prompts_cycle_through_the_seed_questions() -> None:
    prompts = seed_suite.batch_prompts(6)
    assert prompts[:4] == list(seed_suite.SEED_PROMPTS) and prompts[4:] == prompts[:2]


def test_median_seconds_warms_up_once_then_times_each_repeat() -> None:
    calls: list[int] = []
    assert seed_suite.median_seconds(lambda: calls.append(1), repeats=3) >= 0
    assert len(calls) == 4


def recorded_document() -> dict:
    trace = {
        "latencies_ms": [5.0, 2.0, 2.1],
        "first_token_ms": 5.0,
        "mean_decode_ms": 2.05,
        "total_ms": 9.1,
        "growth": {"slope_ms_per_token": 0.1},
    }
    efficiency = [
        {
            "engine": engine,
            "batch": batch,
            "seconds": 1.0,
            "output_tokens_per_s": 8.0 * batch,
            "speedup": speed,
            "efficiency": speed / batch,
        }
        for engine, batch, speed in (
            ("hf", 1, 1.0),
            ("hf", 4, 2.0),
            ("vllm", 1, 1.0),
            ("vllm", 4, 3.6),
        )
    ]
    return {
        "model_id": "m",
        "dtype": "float32",
        "new_tokens": 8,
        "repeats": 1,
        "one_prompt": {"new_tokens": 8, "hf_generate_s": 2.0, "vllm_s": 0.5, "speedup": 4.0},
        "kv_cache": {
            "no-cache": {**trace, "mean_decode_ms": 6.0, "total_ms": 20.0},
            "kv-cache": trace,
            "prompt_tokens": 4,
            "total_speedup": 2.2,
        },
        "four_prompts": {"one_by_one_s": 2.0, "batched_s": 1.1, "speedup": 1.82},
        "batch_efficiency": efficiency,
        "static_batch_waste": {
            "prompt_tokens": [3, 5],
            "output_tokens": [2, 8],
            "padding_waste": 0.2,
            "idle_waste": 0.375,
            "one_by_one_s": 2.0,
            "batched_s": 1.5,
            "measured_speedup": 1.33,
            "batch_step_cost_ratio": 1.5,
            "expected_speedup": 1.67,
        },
    }


def test_report_states_each_experiment_and_writes_its_files(tmp_path: Path) -> None:
    doc = recorded_document()
    lines = seed_report.summary_lines(doc)
    assert [line[:2] for line in lines] == ["a.", "b.", "c.", "d.", "e."]
    assert "vLLM x4.00" in lines[0] and "x1.82, not x4" in lines[2]
    assert "static 50%, vLLM 90%" in lines[3]
    assert "38% of decode slots" in lines[4] and "measured x1.33" in lines[4]
    paths = write_report(seed_report.report(doc), tmp_path)
    assert [p.name for p in paths] == ["result.json", "summary.md", "seed.png"]
    assert json.loads(paths[0].read_text()) == {"scenario": "seed", **doc}
    assert "| vllm | 4 |" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"

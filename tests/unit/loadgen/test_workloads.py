"""Workloads: deterministic arrival schedules and prompt sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.loadgen import workloads as wl


def test_gamma_arrivals_are_deterministic_for_a_seed() -> None:
    first = wl.gamma_arrivals(50, rate=4.0, burstiness=1.0, seed=7)
    assert first == wl.gamma_arrivals(50, rate=4.0, burstiness=1.0, seed=7)
    assert first != wl.gamma_arrivals(50, rate=4.0, burstiness=1.0, seed=8)
    assert first[0] == 0.0
    assert all(b >= a for a, b in zip(first, first[1:]))


def test_gamma_arrivals_keep_the_rate_and_burstiness_sets_the_spread() -> None:
    gaps = {
        b: np.diff(wl.gamma_arrivals(4000, rate=5.0, burstiness=b, seed=1)) for b in (0.25, 1, 4)
    }
    for spread in gaps.values():
        assert spread.mean() == pytest.approx(0.2, rel=0.1)
    cv = {b: g.std() / g.mean() for b, g in gaps.items()}  # gamma: cv = 1/sqrt(shape)
    assert cv[0.25] > cv[1] > cv[4]
    assert cv[1] == pytest.approx(1.0, rel=0.1)


def test_gamma_arrivals_reject_nonpositive_rates() -> None:
    with pytest.raises(wl.WorkloadError):
        wl.gamma_arrivals(3, rate=0, burstiness=1, seed=0)


def test_step_burst_is_an_even_phase_then_everything_at_once() -> None:
    arrivals = wl.step_burst_arrivals(8, rate=2.0)
    assert arrivals == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0]


def test_sweep_and_poisson_levels_have_labels_for_require() -> None:
    assert [lv.label for lv in wl.sweep_levels([1, 4], 8)] == ["c1", "c4"]
    poisson = wl.poisson_levels([0.5, 2], 6, burstiness=1.0, seed=0, max_concurrency=4)
    assert [lv.label for lv in poisson] == ["r0.5", "r2"]
    assert len(poisson[0].arrivals) == 6 and poisson[0].concurrency == 4


def test_split_level_interleaves_in_rounds_that_still_fill_the_concurrency() -> None:
    level = wl.LoadLevel("c4", 8, concurrency=4)
    assert wl.rounds_for(level, 2) == 2
    assert wl.rounds_for(level, 4) == 2  # a round of 2 requests could not run 4 at once
    assert wl.rounds_for(wl.LoadLevel("c8", 8, concurrency=8), 2) == 1
    chunks = wl.split_level(level, 2)
    assert [c.num_requests for c in chunks] == [4, 4]


def test_split_level_restarts_arrival_offsets() -> None:
    level = wl.LoadLevel("r1", 4, arrivals=(0.0, 1.0, 2.0, 3.5))
    chunks = wl.split_level(level, 2)
    assert [c.arrivals for c in chunks] == [(0.0, 1.0), (0.0, 1.5)]


def test_synthetic_prompts_are_deterministic_with_lengths_in_range() -> None:
    specs = wl.synthetic_requests(20, input_len=10, output_len=8, seed=3, range_ratio=0.5)
    assert specs == wl.synthetic_requests(20, input_len=10, output_len=8, seed=3, range_ratio=0.5)
    assert all(5 <= s.input_len <= 15 and 4 <= s.output_len <= 12 for s in specs)
    assert all(len(s.prompt.split()) == s.input_len for s in specs)  # ~1 word per token


class CharTokenizer:
    """One token per character: makes the exact trimming visible."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_synthetic_prompts_with_a_tokenizer_have_exact_token_counts() -> None:
    specs = wl.synthetic_requests(5, input_len=12, output_len=4, seed=0, tokenizer=CharTokenizer())
    assert all(len(s.prompt) == 12 for s in specs)


def test_synthetic_rejects_bad_lengths() -> None:
    with pytest.raises(wl.WorkloadError):
        wl.synthetic_requests(1, input_len=0, output_len=4, seed=0)
    with pytest.raises(wl.WorkloadError):
        wl.synthetic_requests(1, input_len=4, output_len=4, seed=0, range_ratio=1.0)


def test_seed_prompts_cycle() -> None:
    specs = wl.seed_requests(6, output_len=16)
    assert [s.prompt for s in specs[4:]] == [s.prompt for s in specs[:2]]
    assert {s.output_len for s in specs} == {16}


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"prompt": "bye", "output_len": 3}\n')
    specs = wl.jsonl_requests(path, 3, output_len=8)
    assert [(s.prompt, s.output_len) for s in specs] == [("hello", 8), ("bye", 3), ("hello", 8)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "has no prompts"),
        ('{"prompt": "a"}\nnot json\n', ":2: not JSON"),
        ('{"text": "a"}\n', "non-empty string field 'prompt'"),
        ('{"prompt": "a", "output_len": 0}\n', "positive integer"),
    ],
)
def test_bad_jsonl_prompt_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(wl.WorkloadError, match=message):
        wl.jsonl_requests(path, 1, output_len=4)


def test_missing_prompt_file() -> None:
    with pytest.raises(wl.WorkloadError, match="cannot read"):
        wl.jsonl_requests("/nonexistent/prompts.jsonl", 1, output_len=4)

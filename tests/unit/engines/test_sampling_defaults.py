"""Sampling fields a request leaves out: the model's generation_config values, as `vllm serve`
uses them, else the neutral ones; and the extension fields (top_k, min_p, repetition_penalty) in
the HF baseline's sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from serving.api.generation import sampling_spec
from serving.api.protocol import CompletionRequest
from serving.api.routes import build_openai_app
from serving.engines.base import SamplingSpec
from serving.engines.hf_rows import Row, choose_token, seeded_generator
from serving.engines.sampling_defaults import model_sampling_defaults
from tests.unit.fake_engine import FakeEngine

QWEN_INSTRUCT = {  # the shape of Qwen2.5-*-Instruct's generation_config.json
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_new_tokens": 2048,
    "eos_token_id": [151645, 151643],
}


def request(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "a", **fields})


def test_the_model_sampling_defaults_come_from_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN_INSTRUCT))
    assert model_sampling_defaults(tmp_path) == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }


def test_a_model_without_generation_config_has_no_defaults(tmp_path: Path) -> None:
    assert model_sampling_defaults(tmp_path) == {}


def test_left_out_fields_take_the_model_defaults_and_set_ones_win() -> None:
    defaults = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    spec = sampling_spec(request(temperature=0.0), 4, 0, defaults)
    assert (spec.temperature, spec.top_p, spec.top_k, spec.repetition_penalty) == (
        0.0,
        0.8,
        20,
        1.05,
    )


def test_without_model_defaults_the_fields_are_neutral() -> None:
    spec = sampling_spec(request(), 4, 0, {})
    neutral = SamplingSpec(max_tokens=4)
    assert spec == neutral
    assert (spec.temperature, spec.top_p, spec.top_k, spec.min_p) == (1.0, 1.0, 0, 0.0)


def test_top_k_minus_one_means_every_token() -> None:
    assert sampling_spec(request(top_k=-1), 4, 0, {"top_k": 20}).top_k == 0


def test_the_routes_hand_the_engine_the_model_defaults() -> None:
    engine = FakeEngine()
    engine.sampling_defaults = {"temperature": 0.0, "top_k": 5}
    client = TestClient(build_openai_app(engine))
    body = {"model": "fake-model", "prompt": "alpha", "max_tokens": 2}
    assert client.post("/v1/completions", json=body).status_code == 200
    assert client.post(
        "/v1/completions", json={**body, "temperature": 0.9, "min_p": 0.1}
    ).is_success
    first, second = engine.sampled
    assert (first.temperature, first.top_k, first.min_p) == (0.0, 5, 0.0)
    assert (second.temperature, second.top_k, second.min_p) == (0.9, 5, 0.1)


def sample(logits: torch.Tensor, seed: int, prompt: list[int] | None = None, **spec: object) -> int:
    row = Row("r", prompt or [0], SamplingSpec(max_tokens=1, **spec), "kv-cache", print)
    row.generator = seeded_generator(seed, torch.device("cpu"))
    return choose_token(logits, row, eos_ids=[])


FLAT = torch.tensor([2.0, 1.9, 1.8, 1.7, 1.6, 1.5])  # sampling at temperature 1 picks any of them


def test_top_k_one_and_min_p_one_pick_the_most_likely_token() -> None:
    assert {sample(FLAT, seed) for seed in range(40)} != {0}
    assert {sample(FLAT, seed, top_k=1) for seed in range(40)} == {0}
    assert {sample(FLAT, seed, min_p=1.0) for seed in range(40)} == {0}


def test_top_k_samples_only_among_the_k_best() -> None:
    assert {sample(FLAT, seed, top_k=2) for seed in range(60)} == {0, 1}


@pytest.mark.parametrize("penalty,expected", [(1.0, 0), (1.2, 1)])
def test_repetition_penalty_discourages_a_prompt_token(penalty: float, expected: int) -> None:
    # Token 0 is in the prompt: at 1.2 its logit 2.0 falls to 1.67, below token 1's 1.9.
    assert sample(FLAT, 0, prompt=[0], temperature=0.0, repetition_penalty=penalty) == expected

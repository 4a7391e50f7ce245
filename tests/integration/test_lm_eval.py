"""lm-evaluation-harness (`local-completions`, which scores by echo + prompt logprobs) runs a
multiple-choice task of our own through the platform's vLLM route, the HF baseline route and plain
vLLM's server: the same accuracy on all three and every choice's loglikelihood within 1e-3
(float32). Offline: a local JSON dataset, the tokenizer from the local model directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.models import resolve_model
from tests.integration.conftest import MODEL, Platform

TASK_DIR = Path(__file__).parent / "lm_eval_task"
TOLERANCE = 1e-3


def task_config() -> dict[str, Any]:
    """The task's YAML with its dataset file as an absolute path (lm-eval reads it from the cwd)."""
    config = yaml.safe_load((TASK_DIR / "capitals.yaml").read_text())
    config["dataset_kwargs"]["data_files"]["test"] = str(TASK_DIR / "capitals.json")
    return config


def evaluate(base_url: str) -> tuple[float, dict[int, list[float]]]:
    """Accuracy and each question's per-choice loglikelihoods from one lm-eval run."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # read when `datasets` is first imported
    import lm_eval

    config = task_config()
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{base_url}/completions",
            "model": MODEL,
            "tokenizer": str(resolve_model(MODEL, None)),
            "tokenizer_backend": "huggingface",
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=[config],
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )
    accuracy = out["results"][config["task"]]["acc,none"]
    logliks = {
        sample["doc_id"]: [float(resp[0]) for resp in sample["filtered_resps"]]
        for sample in out["samples"][config["task"]]
    }
    return accuracy, logliks


@pytest.fixture(scope="module")
def baseline(platform: Platform) -> tuple[float, dict[int, list[float]]]:
    return evaluate(f"{platform.url}/hf/v1")


@pytest.mark.parametrize("target", ["plain-vllm", "platform-vllm"])
def test_lm_eval_scores_agree_with_the_hf_baseline(
    target: str,
    baseline: tuple[float, dict[int, list[float]]],
    platform: Platform,
    request: pytest.FixtureRequest,
) -> None:
    url = request.getfixturevalue("plain_vllm") if target == "plain-vllm" else platform.api
    accuracy, logliks = evaluate(url)
    base_accuracy, base_logliks = baseline
    assert len(base_logliks) == 10 and all(len(choices) == 4 for choices in base_logliks.values())
    assert logliks.keys() == base_logliks.keys()
    diff = max(abs(a - b) for doc in logliks for a, b in zip(logliks[doc], base_logliks[doc]))
    assert diff < TOLERANCE, f"max |loglikelihood diff| {diff:.2e}"
    assert accuracy == base_accuracy

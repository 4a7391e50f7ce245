"""A rolling update at full scale needs a GPU beyond max_replicas (issue 35, finding 7b): Serve
starts ceil(max_surge_percent x replicas / 100) new replicas before old ones stop. When the GPU
group cannot hold them, the install notes say so and what to raise; more replicas than GPUs at
all stays a hard failure (tests/k8s/test_bad_values.py)."""

from __future__ import annotations

from typing import Any

from serving.k8s import chart as k8s_render
from tests.k8s.test_chart_models import NO_VLLM_DEFAULTS

WARNING = "rolling update"


def notes(values: dict[str, Any]) -> str:
    return k8s_render.notes(values)


def test_default_warns_that_a_surge_replica_finds_no_gpu() -> None:
    text = notes({})
    assert WARNING in text
    line = text[text.index("WARNING") :]
    assert (
        "platform.vllm" in line and "full scale (4 replicas)" in line and "1 surge replica" in line
    )
    assert "needs 5 GPUs" in line and "workers.gpu.maxReplicas x gpusPerWorker = 4" in line
    assert "workers.gpu.maxReplicas=5" in line and "max_surge_percent" in line


def test_room_for_the_surge_or_no_surge_says_nothing() -> None:
    assert WARNING not in notes({"workers": {"gpu": {"maxReplicas": 5}}})
    assert WARNING not in notes({"platform": {"vllm": {"max_surge_percent": 0}}})
    assert WARNING not in notes({"workers": {"gpu": {"gpusPerWorker": 2}}})


def test_each_model_counts_its_own_surge() -> None:
    models = [
        {"name": "a", "resources": {"accelerator": "gpu"}, "autoscaling": {"max_replicas": 4}},
        {"name": "b", "resources": {"accelerator": "gpu"}, "num_replicas": 2},
    ]
    values = {
        "platform": NO_VLLM_DEFAULTS | {"models": models},
        "workers": {"gpu": {"maxReplicas": 6}},
    }
    text = notes(values)
    line = text[text.index("WARNING") :]
    assert "platform.models[0] (a)" in line and "needs 7 GPUs" in line
    assert "workers.gpu.maxReplicas=7" in line
    values["workers"]["gpu"]["maxReplicas"] = 7
    assert WARNING not in notes(values)

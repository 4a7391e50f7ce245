"""operators.spec: an invalid LLMService spec is a SpecError naming the field (pydantic's checks
and the GPU capacity rules the chart applies too)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice.yaml").read_text())


def spec(**changes: Any) -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE["spec"]) | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": {"min": 3, "max": 2}}, "workers.min (3) must not exceed workers.max (2)"),
        ({"gpusPerReplica": 0}, "need 4 GPU(s) but gpusPerReplica is 0"),
        (
            {
                "gpusPerReplica": 0,
                "platform": {
                    **EXAMPLE["spec"]["platform"],
                    "hf": {"resources": {"accelerator": "gpu"}, "num_replicas": 2},
                    "analysis": {"resources": {"accelerator": "gpu"}},
                },
            },
            "need 7 GPU(s) but gpusPerReplica is 0",  # as the chart counts (test_bad_values)
        ),
        (
            {"workers": {"min": 1, "max": 2}},
            "Serve may run 4 GPU replica(s) but workers.max x gpusPerReplica = 2",
        ),
        (
            {"platform": {"vllm": {"num_replicas": 0}}},
            "platform.vllm.num_replicas: Input should be greater than or equal to 1",
        ),
        ({"platform": {"modle": {}}}, "platform.modle: Extra inputs are not permitted"),
        ({"image": None}, "image: Input should be a valid string"),
        (
            {"platform": {**EXAMPLE["spec"]["platform"], "auth": {"api_keys": ["sk-a"]}}},
            "platform.auth.api_keys: API keys written in the spec would travel in the "
            "RayService's serve config",
        ),
        (
            {
                "platform": {
                    **EXAMPLE["spec"]["platform"],
                    "analysis": {"auth": {"api_keys": ["k"]}},
                }
            },
            "platform.analysis.auth.api_keys:",
        ),
        ({"rayAuth": "off"}, "rayAuth: Input should be 'token' or 'disabled'"),
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**changes))
    assert message in str(err.value)


def test_inline_keys_are_refused_and_the_message_points_to_the_secret() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec(platform={"auth": {"api_keys": ["sk-secret-1"]}}))
    assert "apiKeySecret" in str(err.value)
    assert "sk-secret-1" not in str(err.value)


def test_a_surge_without_a_gpu_is_named() -> None:
    """The example runs up to 4 GPU replicas on at most 4 GPUs: a rolling update at full scale
    starts ceil(25% x 4) = 1 more and waits for a fifth GPU (the chart's install note says so)."""
    from operators.spec import surge_shortfall

    shortfall = surge_shortfall(parse_spec(spec()))
    assert shortfall and "starts 1 surge replica(s) beside the 4 GPU replica(s)" in shortfall
    assert surge_shortfall(parse_spec(spec(workers={"min": 1, "max": 5}))) is None
    platform = copy.deepcopy(EXAMPLE["spec"]["platform"])
    platform["vllm"]["max_surge_percent"] = 0
    assert surge_shortfall(parse_spec(spec(platform=platform))) is None


def test_a_store_each_pod_keeps_alone_is_named() -> None:
    """Without a PostgreSQL platform.state.url, several worker pods keep separate SQLite stores
    (the operator deploys no database): it warns, unless the state features are off or one pod
    runs everything."""
    from operators.spec import unshared_state

    warning = unshared_state(parse_spec(spec()))
    assert warning and "platform.state.url" in warning and "up to 4 worker pods" in warning
    one_pod = copy.deepcopy(EXAMPLE["spec"]["platform"])
    one_pod["vllm"]["autoscaling"]["max_replicas"] = 1
    assert unshared_state(parse_spec(spec(platform=one_pod, workers={"min": 1, "max": 1}))) is None
    shared = copy.deepcopy(EXAMPLE["spec"]["platform"])
    shared["state"] = {"url": "postgresql+psycopg://llm@db:5432/llm"}
    assert unshared_state(parse_spec(spec(platform=shared))) is None
    off = copy.deepcopy(EXAMPLE["spec"]["platform"])
    off["state"] = {"responses": False, "batch": {"enabled": False}}
    assert unshared_state(parse_spec(spec(platform=off))) is None

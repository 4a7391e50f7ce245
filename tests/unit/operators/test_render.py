"""operators.render's pure parts, without Helm: values that Helm coalesces onto the chart's into
exactly the LLMService's, the image split into the chart's repository and tag, the owner
reference. Rendering through the chart: tests/k8s/test_operator_render.py."""

from __future__ import annotations

from typing import Any

import pytest

from operators import render
from operators.spec import parse_spec


def coalesce(default: Any, values: Any) -> Any:
    """Helm's coalescing of user values onto chart defaults (maps merge, null deletes a key)."""
    if not (isinstance(default, dict) and isinstance(values, dict)):
        return values
    merged = dict(default)
    for key, value in values.items():
        if value is None and key in default:
            merged.pop(key)
        else:
            merged[key] = coalesce(default.get(key), value)
    return merged


@pytest.mark.parametrize(
    ("default", "desired"),
    [
        ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 5}}),
        ({"args": {"tool_call_parser": "hermes"}}, {"args": {}}),
        ({"tolerations": [{"key": "gpu"}]}, {"tolerations": []}),
        ({"x": {"y": 1}}, {"x": 7, "z": {"w": None}}),
        ({}, {"model": {"ref": "tiny-qwen2"}}),
    ],
)
def test_exactly_survives_helms_coalescing(
    default: dict[str, Any], desired: dict[str, Any]
) -> None:
    assert coalesce(default, render.exactly(default, desired)) == desired


LATEST = {"tag": "latest", "pullPolicy": "Always"}


@pytest.mark.parametrize(
    ("image", "values"),
    [
        ("llm-serving-gpu:0.1.0", {"repository": "llm-serving-gpu", "tag": "0.1.0"}),
        ("registry:5000/team/llm:1", {"repository": "registry:5000/team/llm", "tag": "1"}),
        # Failed before: `latest` with the chart's IfNotPresent (a node kept its first pull).
        ("registry:5000/team/llm", {"repository": "registry:5000/team/llm", **LATEST}),
        ("llm", {"repository": "llm", **LATEST}),
        ("llm:latest", {"repository": "llm", **LATEST}),
        ("llm@sha256:abc", {"repository": "llm@sha256", "tag": "abc"}),
    ],
)
def test_image_splits_into_the_charts_repository_and_tag(
    image: str, values: dict[str, str]
) -> None:
    assert render.image_values(image) == values
    if values["tag"] != "latest":  # the chart's `repository:tag` is the image as written
        assert f"{values['repository']}:{values['tag']}" == image


def test_owner_reference_makes_the_llmservice_the_controller() -> None:
    owner = {"metadata": {"name": "qwen", "uid": "u-1"}}
    reference = render.owner_reference(owner)
    assert (reference["kind"], reference["uid"], reference["controller"]) == (
        "LLMService",
        "u-1",
        True,
    )
    assert reference["apiVersion"] == "serving.llm-serving.io/v1alpha1"


def test_only_gpu_services_with_cpu_apps_need_the_cpu_group() -> None:
    cpu_hf = {"hf": {"enabled": True}, "analysis": {"enabled": False}}
    assert render.needs_cpu_group(parse_spec({"image": "i", "platform": cpu_hf}))
    off = {"hf": {"enabled": False}, "analysis": {"enabled": False}}
    gpu_only = off | {"vllm": {"resources": {"accelerator": "gpu"}, "num_replicas": 1}}
    assert not render.needs_cpu_group(parse_spec({"image": "i", "platform": gpu_only}))
    assert not render.needs_cpu_group(parse_spec({"image": "i", "gpusPerReplica": 0}))


SCALED = {
    "image": "i",
    "platform": {"vllm": {"autoscaling": {"min_replicas": 1, "max_replicas": 4}}},
}


def test_a_new_cluster_starts_at_the_live_replicas() -> None:
    """Failed before (no such step): the new RayCluster of an upgrade started at min_replicas."""
    written = render.starting_at_live_replicas(parse_spec(SCALED), {"vllm": 3})
    assert written["vllm"]["autoscaling"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 3,
    }


@pytest.mark.parametrize(
    ("live", "expected"),
    [({}, None), ({"vllm": 1}, None), ({"vllm": 9}, 4), ({"hf": 3}, None)],
)
def test_live_replicas_within_the_bounds_only(live: dict[str, int], expected: int | None) -> None:
    written = render.starting_at_live_replicas(parse_spec(SCALED), live)
    assert written["vllm"]["autoscaling"].get("initial_replicas") == expected


def test_each_model_starts_at_its_own_live_replicas() -> None:
    scaling = {"min_replicas": 1, "max_replicas": 3}
    models = [
        {"name": "a", "model": {"ref": "tiny-qwen2"}, "autoscaling": scaling},
        {"name": "b", "model": {"ref": "tiny-qwen2"}, "autoscaling": scaling},
    ]
    spec = parse_spec({"image": "i", "platform": {"models": models}})
    written = render.starting_at_live_replicas(spec, {"vllm-a": 2, "vllm-b": 1, "vllm": 5})
    starts = [m["autoscaling"].get("initial_replicas") for m in written["models"]]
    assert starts == [2, None]


def test_an_initial_replicas_written_wins() -> None:
    spec = {
        "image": "i",
        "platform": {"vllm": {"autoscaling": {"max_replicas": 4, "initial_replicas": 2}}},
    }
    written = render.starting_at_live_replicas(parse_spec(spec), {"vllm": 4})
    assert written["vllm"]["autoscaling"]["initial_replicas"] == 2


@pytest.mark.parametrize(
    ("changes", "modes", "refused"),
    [
        ({}, ["ReadWriteOnce"], True),
        ({}, ["ReadWriteMany"], False),
        ({}, None, False),  # not there yet: the pods wait for it, nothing to judge
        ({"workers": {"min": 1, "max": 1}, "upgradeStrategy": "None"}, ["ReadWriteOnce"], False),
        ({"workers": {"min": 1, "max": 1}}, ["ReadWriteOnce"], True),  # the new cluster's pod
    ],
)
def test_a_claim_one_node_mounts_serves_one_pod_only(
    changes: dict[str, Any], modes: list[str] | None, refused: bool
) -> None:
    gpu_only = {"vllm": {"resources": {"accelerator": "gpu"}}}
    only_vllm = gpu_only | {"hf": {"enabled": False}, "analysis": {"enabled": False}}
    spec = {"image": "i", "platform": only_vllm, "pods": {"modelCacheClaim": "models"}, **changes}
    problem = render.cache_claim_problem(parse_spec(spec), modes)
    assert (problem is not None) is refused

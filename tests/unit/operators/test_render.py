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


@pytest.mark.parametrize(
    ("image", "values"),
    [
        ("llm-serving-gpu:0.1.0", {"repository": "llm-serving-gpu", "tag": "0.1.0"}),
        ("registry:5000/team/llm:1", {"repository": "registry:5000/team/llm", "tag": "1"}),
        ("registry:5000/team/llm", {"repository": "registry:5000/team/llm", "tag": "latest"}),
        ("llm", {"repository": "llm", "tag": "latest"}),
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

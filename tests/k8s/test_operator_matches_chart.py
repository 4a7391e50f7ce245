"""The operator's RayService equals the chart's, field for field, for the same platform config and
cluster knobs (issue 8, item 3). The chart is rendered with Helm's own engine (helm-python-sdk);
an LLMService's knobs map onto chart values as operators/render.py documents."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from operators.render import render_rayservice
from serving.k8s import chart as k8s_render

NAME, NAMESPACE = "qwen", "team-a"
Doc = dict[str, Any]

# (platform overrides on the chart's default platform, LLMService knobs)
CASES: dict[str, tuple[Doc, Doc]] = {
    "chart-defaults": (
        {},
        {
            "image": "llm-serving-gpu:0.1.0",
            "gpusPerReplica": 1,
            "workers": {"min": 1, "max": 4},
            "resources": {
                "requests": {"cpu": "4", "memory": "24Gi"},
                "limits": {"cpu": "4", "memory": "24Gi"},
            },
        },
    ),
    "two-gpus-per-worker": (
        {
            "model": {"ref": "Qwen/Qwen2.5-1.5B", "max_model_len": 8192},
            "http": {"port": 9000},
            "vllm": {"autoscaling": {"max_replicas": 6, "downscale_delay_s": 300}},
            "hf": {"enabled": False},
        },
        {
            "image": "registry.local/llm-serving-gpu:0.2.0",
            "gpusPerReplica": 2,
            "workers": {"min": 0, "max": 3},
            "resources": {
                "requests": {"cpu": "8", "memory": "48Gi"},
                "limits": {"cpu": "8", "memory": "48Gi"},
            },
        },
    ),
    "cpu-only": (
        {
            "model": {"ref": "tiny-qwen2", "max_model_len": 1024},
            "vllm": {
                "autoscaling": {"max_replicas": 2, "target_queue_depth": 8},
                "resources": {"accelerator": "cpu"},
                "engine": {
                    "gpu_memory_utilization": None,
                    "kv_cache_memory_gb": 1,
                    "enforce_eager": True,
                },
            },
        },
        {
            "image": "llm-serving-cpu:0.1.0",
            "gpusPerReplica": 0,
            "workers": {"min": 1, "max": 2},
            "resources": {
                "requests": {"cpu": "4", "memory": "8Gi"},
                "limits": {"cpu": "4", "memory": "8Gi"},
            },
        },
    ),
}


# API keys from a Secret, read from a variable the platform config renames.
CASES["api-keys-from-a-secret"] = (
    {**CASES["cpu-only"][0], "auth": {"api_keys_env": "TEAM_KEYS"}},
    {**CASES["cpu-only"][1], "apiKeySecret": {"name": "team-keys", "key": "keys"}},
)


# Every pod setting: a private registry, a gated model's token, a shared cache, placement.
CASES["pod-settings"] = (
    {},
    {
        **CASES["chart-defaults"][1],
        "upgradeStrategy": "None",
        "pods": {
            "imagePullSecrets": [{"name": "regcred"}],
            "hfTokenSecret": {"name": "hf", "key": "token"},
            "modelCacheClaim": "models",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
            ],
            "runtimeClassName": "nvidia",
            "priorityClassName": "inference",
        },
    },
)


# Two models with adapters on GPU workers (the analysis app keeps the CPU group), as the chart's
# ci/multi-model-values.yaml: the chart's single-model vllm defaults are nulled.
CASES["two-models"] = (
    yaml.safe_load((k8s_render.CHART_DIR / "ci" / "multi-model-values.yaml").read_text())[
        "platform"
    ],
    CASES["chart-defaults"][1],
)


def platform_of(overrides: Doc) -> Doc:
    """The platform block an install of the chart ends up with: its default platform with the
    overrides merged in (null deletes a key). The LLMService gets this whole block, so neither
    side fills in defaults of its own."""
    return k8s_render.merged_values({"platform": overrides})["platform"]


def chart_values(knobs: Doc, overrides: Doc) -> Doc:
    repository, tag = knobs["image"].rsplit(":", 1)
    kind = "gpu" if knobs["gpusPerReplica"] else "cpu"
    group = {
        "enabled": True,
        "replicas": knobs["workers"]["min"],
        "minReplicas": knobs["workers"]["min"],
        "maxReplicas": knobs["workers"]["max"],
        "resources": knobs["resources"],
    }
    if kind == "gpu":
        group["gpusPerWorker"] = knobs["gpusPerReplica"]
    # A GPU LLMService gets the chart's default CPU group when it runs CPU apps (HF, analysis).
    workers = {kind: group} if kind == "gpu" else {"cpu": group, "gpu": {"enabled": False}}
    values = {
        "fullnameOverride": NAME,  # the LLMService's name plays the release's fullname
        "image": {"repository": repository, "tag": tag},
        "platform": overrides,
        "workers": workers,
    }
    if "apiKeySecret" in knobs:
        secret = knobs["apiKeySecret"]
        values["apiKeys"] = {"existingSecret": secret["name"], "key": secret["key"]}
    if "upgradeStrategy" in knobs:
        values["ray"] = {"upgradeStrategy": knobs["upgradeStrategy"]}
    pods = knobs.get("pods", {})
    group.update({k: pods[k] for k in PLACEMENT if k in pods})
    if "imagePullSecrets" in pods:
        values["imagePullSecrets"] = pods["imagePullSecrets"]
    if "hfTokenSecret" in pods:
        token = pods["hfTokenSecret"]
        values["model"] = {"hfToken": {"existingSecret": token["name"], "key": token["key"]}}
    if "modelCacheClaim" in pods:
        claim = {"enabled": True, "existingClaim": pods["modelCacheClaim"]}
        values.setdefault("model", {})["cache"] = {"persistentVolumeClaim": claim}
    return values


PLACEMENT = ("nodeSelector", "tolerations", "runtimeClassName", "priorityClassName")


def comparable(spec: Doc) -> Doc:
    """The spec with serveConfigV2 parsed (YAML layout is not content) and without the API
    Service's labels: Helm's say managed-by Helm and name the chart version, the operator's say
    managed-by llm-serving-operator and name the LLMService, both truthfully."""
    spec = copy.deepcopy(spec)
    spec["serveConfigV2"] = yaml.safe_load(spec["serveConfigV2"])
    spec["serveService"]["metadata"].pop("labels")
    return spec


def differences(ours: Any, chart: Any, path: str = "spec") -> list[str]:
    if isinstance(ours, dict) and isinstance(chart, dict):
        found = []
        for key in sorted(set(ours) | set(chart)):
            if key not in chart:
                found.append(f"{path}.{key}: only the operator sets it")
            elif key not in ours:
                found.append(
                    f"{path}.{key}: only the chart sets it ({json.dumps(chart[key])[:120]})"
                )
            else:
                found += differences(ours[key], chart[key], f"{path}.{key}")
        return found
    if isinstance(ours, list) and isinstance(chart, list) and len(ours) == len(chart):
        return [
            d
            for i, (a, b) in enumerate(zip(ours, chart, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    if ours != chart:
        return [f"{path}: operator {json.dumps(ours)[:120]} != chart {json.dumps(chart)[:120]}"]
    return []


@pytest.mark.parametrize("case", sorted(CASES))
def test_operator_renders_the_charts_rayservice(case: str) -> None:
    overrides, knobs = CASES[case]
    docs = k8s_render.render_documents(
        chart_values(knobs, overrides), release=NAME, namespace=NAMESPACE
    )
    (chart,) = [doc for doc in docs if doc["kind"] == "RayService"]

    ours = render_rayservice(NAME, NAMESPACE, {**knobs, "platform": platform_of(overrides)})

    assert ours["metadata"]["name"] == chart["metadata"]["name"]
    assert differences(comparable(ours["spec"]), comparable(chart["spec"])) == []

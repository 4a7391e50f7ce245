"""A two-model LLMService (k8s/examples/llmservice-multi-model.yaml): the operator counts every
model's GPU replicas and reports each model's Serve application in the status (which the CRD's
schema accepts). Its RayService: tests/k8s/test_operator_render_models.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from operators import crd, status
from operators.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice-multi-model.yaml").read_text())
NOW = "2026-01-01T00:00:00Z"

# What KubeRay (>= 1.3) writes while the second model still loads: the router and the first model
# run, Serve reports the second app DEPLOYING with its deployment's message.
RAYSERVICE_STATUS: dict[str, Any] = {
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "NonZeroServeEndpoints",
            "message": "Number of serve endpoints is greater than 0",
            "lastTransitionTime": NOW,
            "observedGeneration": 1,
        },
        {
            "type": "UpgradeInProgress",
            "status": "False",
            "reason": "NoPendingCluster",
            "message": "No pending cluster exists",
            "lastTransitionTime": NOW,
            "observedGeneration": 1,
        },
    ],
    "serviceStatus": "Running",
    "numServeEndpoints": 1,
    "observedGeneration": 1,
    "activeServiceStatus": {
        "rayClusterName": "team-models-7xk2p",
        "applicationStatuses": {
            "vllm": {
                "status": "RUNNING",
                "serveDeploymentStatuses": {"ModelRouter": {"status": "HEALTHY"}},
            },
            "vllm-qwen": {
                "status": "RUNNING",
                "serveDeploymentStatuses": {
                    "ModelEntry": {"status": "HEALTHY"},
                    "VLLMServer": {"status": "HEALTHY"},
                },
            },
            "vllm-qwen-1.5b": {
                "status": "DEPLOYING",
                "message": "Deploying app 'vllm-qwen-1.5b'.",
                "serveDeploymentStatuses": {
                    "VLLMServer": {
                        "status": "UPDATING",
                        "message": "Deployment 'VLLMServer' in application 'vllm-qwen-1.5b' has 1 "
                        "replicas that have taken more than 30s to initialize.",
                    }
                },
            },
        },
    },
}

METRICS = """
# TYPE ray_serve_deployment_replica_healthy gauge
ray_serve_deployment_replica_healthy{application="vllm",deployment="ModelRouter",replica="r"} 1.0
ray_serve_deployment_replica_healthy{application="vllm-qwen",deployment="VLLMServer",replica="a"} 1.0
ray_serve_deployment_replica_healthy{application="vllm-qwen",deployment="VLLMServer",replica="b"} 1.0
ray_serve_deployment_replica_healthy{application="vllm-qwen-1.5b",deployment="VLLMServer",replica="c"} 0.0
# TYPE ray_llm_serving_queue_depth gauge
ray_llm_serving_queue_depth{engine="vllm",model="qwen",deployment="VLLMServer",replica="a"} 3.0
ray_llm_serving_queue_depth{engine="vllm",model="qwen-1.5b",deployment="VLLMServer",replica="c"} 1.0
ray_llm_serving_queue_depth{engine="hf",model="qwen",deployment="HFBaseline",replica="h"} 9.0
"""


def spec(**changes: Any) -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE["spec"]) | changes


def test_every_models_gpu_replicas_count_against_the_workers() -> None:
    with pytest.raises(SpecError, match=r"Serve may run 3 GPU replica\(s\) .* = 2"):
        parse_spec(spec(workers={"min": 1, "max": 2}))


def observed(rayservice_status: dict[str, Any] | None) -> dict[str, Any]:
    rayservice = None if rayservice_status is None else {"status": rayservice_status}
    load = status.load_from_metrics(METRICS, status.vllm_apps(parse_spec(spec()).platform))
    return status.observed_status(
        "team-models", "ns", parse_spec(spec()), rayservice, load, 1, [], NOW
    )


def test_status_reports_each_models_serve_application() -> None:
    result = observed(RAYSERVICE_STATUS)
    assert result["models"] == [
        {"name": "qwen", "app": "vllm-qwen", "status": "RUNNING", "ready": True},
        {
            "name": "qwen-1.5b",
            "app": "vllm-qwen-1.5b",
            "status": "DEPLOYING",
            "ready": False,
            "message": "Deploying app 'vllm-qwen-1.5b'.",
        },
    ]
    assert result["modelsReady"] == "1/2" and result["model"] == "qwen,qwen-1.5b"
    # Replicas and queue count the models' vLLM replicas, never the router's or the baseline's.
    assert (result["observedReplicas"], result["queueDepth"]) == (2, 4.0)


def test_models_without_a_reported_app_are_not_ready() -> None:
    result = observed(None)
    assert [(m["name"], m["ready"], "status" in m) for m in result["models"]] == [
        ("qwen", False, False),
        ("qwen-1.5b", False, False),
    ]
    assert result["modelsReady"] == "0/2"


def test_single_model_status_has_no_models_list() -> None:
    single = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice.yaml").read_text())["spec"]
    result = status.observed_status("qwen", "ns", parse_spec(single), None, None, 1, [], NOW)
    assert (result["models"], result["modelsReady"]) == (None, None)
    assert result["model"] == "Qwen/Qwen2.5-0.5B"


def test_crd_status_schema_accepts_the_models_list() -> None:
    version = crd.crd_manifest()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    from tests.k8s.schemas import closed_schema

    validator = jsonschema.Draft7Validator(closed_schema(openapi_nullable(schema)))
    assert list(validator.iter_errors(observed(RAYSERVICE_STATUS))) == []
    bad = {"models": [{"name": "qwen", "app": "vllm-qwen", "ready": "yes"}]}
    assert list(validator.iter_errors(bad))
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Models"] == ".status.modelsReady"


def openapi_nullable(node: Any) -> Any:
    """OpenAPI's `nullable: true` as JSON Schema (a null type beside the declared one)."""
    if isinstance(node, list):
        return [openapi_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: openapi_nullable(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    return out

"""The operator against an in-memory Kubernetes API with a two-model LLMService
(k8s/examples/llmservice-multi-model.yaml): the RayService carries the router and one app per
model, and each model's Serve application status reaches the LLMService's status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.k8s.llmservice.conftest import NAMESPACE, RAYSERVICES, eventually, llmservice
from tests.k8s.llmservice.test_operator_kmock import LLMSERVICES, MERGE, create, obj

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice-multi-model.yaml").read_text())
NAME = EXAMPLE["metadata"]["name"]
HEALTHY = "ray_serve_deployment_replica_healthy"
METRICS = (
    f"# TYPE {HEALTHY} gauge\n"
    f'{HEALTHY}{{application="vllm",deployment="ModelRouter",replica="r"}} 1.0\n'
    f'{HEALTHY}{{application="vllm-qwen",deployment="VLLMServer",replica="a"}} 1.0\n'
    f'{HEALTHY}{{application="vllm-qwen-1.5b",deployment="VLLMServer",replica="b"}} 1.0\n'
)


def app_statuses(second: str) -> dict[str, Any]:
    return {
        "vllm": {"status": "RUNNING"},
        "vllm-qwen": {"status": "RUNNING"},
        "vllm-qwen-1.5b": {"status": second},
    }


async def report(k8s: Any, apps: dict[str, Any]) -> None:
    """Write the RayService's status as KubeRay would."""
    ready = {"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints"}
    body = {
        "status": {
            "conditions": [ready],
            "serviceStatus": "Running",
            "activeServiceStatus": {"applicationStatuses": apps},
        }
    }
    response = await k8s.patch(
        f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayservices/{NAME}/status",
        json=body,
        headers=MERGE,
    )
    assert response.status == 200


async def test_two_models_deploy_and_report_per_model_readiness(k8s: Any, operator: Any) -> None:
    k8s[f"get /metrics/default/{NAME}"] << METRICS.encode()
    await create(k8s, llmservice(NAME, EXAMPLE["spec"]))

    rayservice = await eventually(lambda: obj(k8s, RAYSERVICES, NAME), what="the RayService")
    serve = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert [app["name"] for app in serve["applications"]] == ["vllm", "vllm-qwen", "vllm-qwen-1.5b"]

    await report(k8s, app_statuses("DEPLOYING"))
    status = await eventually(
        lambda: (s := obj(k8s, LLMSERVICES, NAME)["status"]).get("modelsReady") == "1/2" and s,
        what="one model of two ready",
    )
    assert [(m["name"], m["status"], m["ready"]) for m in status["models"]] == [
        ("qwen", "RUNNING", True),
        ("qwen-1.5b", "DEPLOYING", False),
    ]
    assert status["model"] == "qwen,qwen-1.5b"

    await report(k8s, app_statuses("RUNNING"))
    status = await eventually(
        lambda: (s := obj(k8s, LLMSERVICES, NAME)["status"]).get("modelsReady") == "2/2" and s,
        what="both models ready",
    )
    assert all(m["ready"] for m in status["models"])
    # The router's replica is no model replica: two vLLM replicas, one per model.
    await eventually(lambda: obj(k8s, LLMSERVICES, NAME)["status"].get("observedReplicas") == 2)

"""What a real cluster does that a happy path does not: no KubeRay CRDs (Degraded with a clear
message, no crash loop), and Ray's replica gauge missing from most scrapes (the status keeps the
last count and when it was seen instead of flickering)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.k8s.llmservice.conftest import LLMSERVICES, RAYSERVICES, eventually, llmservice
from tests.k8s.llmservice.test_operator_kmock import condition, create, example, obj

HEALTHY = "ray_serve_deployment_replica_healthy"
WITH_GAUGE = (
    f"# TYPE {HEALTHY} gauge\n"
    f'{HEALTHY}{{application="vllm",deployment="VLLMServer",replica="a"}} 1.0\n'
    f'{HEALTHY}{{application="vllm",deployment="VLLMServer",replica="b"}} 1.0\n'
)
WITHOUT_GAUGE = (  # what Ray's agent exports between two refreshes of the gauge
    "# TYPE ray_serve_autoscaling_total_requests gauge\n"
    'ray_serve_autoscaling_total_requests{application="vllm",deployment="VLLMServer"} 3.0\n'
)


@pytest.fixture
async def without_kuberay(k8s: Any) -> Any:
    """The in-memory API with no RayService resource (requested before `operator` starts)."""
    del k8s.resources[RAYSERVICES]
    return k8s


async def test_missing_kuberay_crd_is_degraded_with_a_clear_message(
    without_kuberay: Any, operator: Any
) -> None:
    k8s = without_kuberay
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)
    degraded = await eventually(
        lambda: (c := condition(obj(k8s, LLMSERVICES, name), "Degraded"))["status"] == "True" and c,
        what="a Degraded condition",
    )
    assert degraded["reason"] == "KubeRayMissing"
    assert "no KubeRay CRDs (ray.io/v1 RayService)" in degraded["message"]
    assert "install the KubeRay operator" in degraded["message"]
    assert condition(obj(k8s, LLMSERVICES, name), "Ready")["status"] == "False"


async def test_replica_count_survives_scrapes_without_the_gauge(k8s: Any, operator: Any) -> None:
    scrapes: list[str] = []

    def metrics() -> bytes:  # the gauge in the first scrape only, as Ray exports it
        scrapes.append("with" if not scrapes else "without")
        return (WITH_GAUGE if len(scrapes) == 1 else WITHOUT_GAUGE).encode()

    k8s["get /metrics/default/qwen"] << metrics
    await create(k8s, llmservice("qwen", copy.deepcopy(example()["spec"])))
    first = await eventually(
        lambda: (s := obj(k8s, LLMSERVICES, "qwen")["status"]).get("observedReplicas") and s,
        what="a replica count",
    )
    assert first["observedReplicas"] == 2 and first["replicasObservedAt"]
    # Several scrapes lacking the gauge later (the queue metric shows they were read):
    later = await eventually(
        lambda: (
            len(scrapes) >= 4
            and obj(k8s, LLMSERVICES, "qwen")["status"].get("queueDepth") == 3.0
            and obj(k8s, LLMSERVICES, "qwen")["status"]
        ),
        what="scrapes without the gauge",
    )
    assert later["observedReplicas"] == 2
    assert later["replicasObservedAt"] == first["replicasObservedAt"]


def test_crd_refuses_names_kuberay_would_reject() -> None:
    """KubeRay rejects RayService names over 47 characters; the CRD says so at `kubectl apply`."""
    from operators.crd import crd_manifest

    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = schema["x-kubernetes-validations"]
    assert rule["rule"] == "size(self.metadata.name) <= 47"

"""The operator against an in-memory Kubernetes API: the example LLMService becomes an owned
RayService, a spec change patches it, deletion removes it, an invalid spec is reported as Degraded
with a readable message and a Warning event, and the RayService's state reaches the status."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.llmservice.conftest import (
    BUDGETS,
    CLAIMS,
    LLMSERVICES,
    NAMESPACE,
    NETWORKPOLICIES,
    RAYSERVICES,
    SYNC_INTERVAL_S,
    eventually,
    llmservice,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "k8s" / "examples" / "llmservice.yaml"
BASE = (
    f"/apis/{LLMSERVICES.rsplit('/', 1)[0]}/namespaces/{NAMESPACE}/{LLMSERVICES.rsplit('/', 1)[1]}"
)
MERGE = {"Content-Type": "application/merge-patch+json"}


def example() -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    meta = llmservice(body["metadata"]["name"], body["spec"])["metadata"]
    return {**body, "metadata": meta}


def obj(k8s: Any, resource: str, name: str) -> dict[str, Any] | None:
    try:  # kmock's `in` does not parse string resources; lookups do
        found = k8s.objects[resource, NAMESPACE, name]
    except KeyError:
        return None
    return None if found.deleted else dict(found.raw)


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == kind)


def posted_events(k8s: Any) -> list[dict[str, Any]]:
    # Recorded requests, not stored objects: kmock keys objects by name and events use generateName.
    return [r.data for r in k8s if r.method == "POST" and r.url.path.endswith("/events")]


async def create(k8s: Any, body: dict[str, Any]) -> None:
    response = await k8s.post(BASE, json=body)
    assert response.status in (200, 201), await response.text()


async def patch(k8s: Any, name: str, changes: dict[str, Any]) -> None:
    response = await k8s.patch(f"{BASE}/{name}", json=changes, headers=MERGE)
    assert response.status == 200, await response.text()


async def test_example_creates_an_owned_rayservice(k8s: Any, operator: Any) -> None:
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)

    rayservice = await eventually(lambda: obj(k8s, RAYSERVICES, name), what="the RayService")
    owner = rayservice["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "LLMService",
        name,
        body["metadata"]["uid"],
        True,
    )
    workers = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert workers["maxReplicas"] == body["spec"]["workers"]["max"]

    status = await eventually(lambda: obj(k8s, LLMSERVICES, name)["status"], what="a status")
    assert status["endpoint"] == f"http://{name}-api.{NAMESPACE}.svc.cluster.local:8000/v1"
    progressing = await eventually(lambda: condition(obj(k8s, LLMSERVICES, name), "Progressing"))
    assert progressing["status"] == "True"
    assert condition(obj(k8s, LLMSERVICES, name), "Ready")["status"] == "False"


async def test_spec_change_patches_the_rayservice(k8s: Any, operator: Any) -> None:
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)
    await eventually(lambda: obj(k8s, RAYSERVICES, name), what="the RayService")

    await patch(
        k8s,
        name,
        {
            "metadata": {"generation": 2},
            "spec": {"workers": {"max": 7}, "image": "llm-serving:next"},
        },
    )

    def patched() -> bool:
        spec = obj(k8s, RAYSERVICES, name)["spec"]["rayClusterConfig"]
        return spec["workerGroupSpecs"][0]["maxReplicas"] == 7 and (
            spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
            == "llm-serving:next"
        )

    await eventually(patched, what="the patched RayService")
    assert len(k8s.objects[RAYSERVICES, NAMESPACE, name].history) >= 2  # patched, not recreated


async def test_a_new_cluster_starts_at_the_live_replicas(k8s: Any, operator: Any) -> None:
    """An image change builds a new RayCluster (KubeRay hashes the pod template): its vLLM app
    starts at the 3 replicas serving now. Failed before: it started at min_replicas (1), and
    KubeRay switched a 3-replica service's traffic to 1 replica."""
    healthy = "ray_serve_deployment_replica_healthy"
    samples = "".join(
        f'{healthy}{{application="vllm",deployment="VLLMServer",replica="{r}"}} 1.0\n'
        for r in "abc"
    )
    k8s["get /metrics/default/scaled"] << f"# TYPE {healthy} gauge\n{samples}".encode()
    await create(k8s, llmservice("scaled", copy.deepcopy(example()["spec"])))
    await eventually(lambda: obj(k8s, RAYSERVICES, "scaled"), what="the RayService")
    # The creation fully handled (its status written) before the change: a change kopf sees
    # first would be a creation, which has no live cluster to start from.
    await eventually(
        lambda: obj(k8s, LLMSERVICES, "scaled")["status"].get("observedGeneration") == 1,
        what="the creation handled",
    )

    await patch(
        k8s, "scaled", {"metadata": {"generation": 2}, "spec": {"image": "llm-serving:next"}}
    )

    def vllm_scaling() -> dict[str, Any]:
        spec = obj(k8s, RAYSERVICES, "scaled")["spec"]
        head = spec["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert head["image"] == "llm-serving:next"
        (app,) = [
            a for a in yaml.safe_load(spec["serveConfigV2"])["applications"] if a["name"] == "vllm"
        ]
        return app["deployments"][0]["autoscaling_config"]

    scaling = await eventually(vllm_scaling, what="the new image")
    assert (scaling["min_replicas"], scaling["initial_replicas"]) == (1, 3)
    # 4 replicas on at most 4 GPUs: a rolling update's surge replica would find none.
    await eventually(
        lambda: "NoGPUForSurge" in [event["reason"] for event in posted_events(k8s)],
        what="the surge warning",
    )


async def test_network_policy_is_owned_and_follows_the_spec(k8s: Any, operator: Any) -> None:
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)

    policy = await eventually(lambda: obj(k8s, NETWORKPOLICIES, f"{name}-ray"), what="the policy")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    rayservice = await eventually(lambda: obj(k8s, RAYSERVICES, name), what="the RayService")
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]
    assert selector.items() <= head["labels"].items()

    await patch(k8s, name, {"metadata": {"generation": 2}, "spec": {"networkPolicy": False}})
    await eventually(
        lambda: obj(k8s, NETWORKPOLICIES, f"{name}-ray") is None, what="the policy removed"
    )


async def test_worker_budgets_follow_the_spec(k8s: Any, operator: Any) -> None:
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)
    budget = await eventually(lambda: obj(k8s, BUDGETS, f"{name}-gpu-workers"), what="a budget")
    assert budget["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert budget["spec"]["minAvailable"] == body["spec"]["workers"]["min"]

    await patch(k8s, name, {"metadata": {"generation": 2}, "spec": {"workers": {"min": 0}}})
    await eventually(
        lambda: obj(k8s, BUDGETS, f"{name}-gpu-workers") is None, what="the budget removed"
    )


async def test_a_claim_one_node_mounts_is_refused(k8s: Any, operator: Any) -> None:
    """Failed before: the operator renders offline, where the chart cannot read an existing
    claim, so a ReadWriteOnce model cache went to every worker pod (Multi-Attach errors)."""
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models"}}
    k8s.objects[CLAIMS, NAMESPACE, "models"] = claim | {"spec": {"accessModes": ["ReadWriteOnce"]}}
    body = example()
    body["spec"]["pods"] = {"modelCacheClaim": "models"}
    await create(k8s, body)
    name = body["metadata"]["name"]
    degraded = await eventually(
        lambda: (c := condition(obj(k8s, LLMSERVICES, name), "Degraded"))["status"] == "True" and c,
        what="a Degraded condition",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert (
        "pods.modelCacheClaim: claim models has access modes ['ReadWriteOnce']"
        in (degraded["message"])
    )
    assert obj(k8s, RAYSERVICES, name) is None


async def test_delete_removes_the_rayservice(k8s: Any, operator: Any) -> None:
    body = example()
    name = body["metadata"]["name"]
    await create(k8s, body)
    await eventually(lambda: obj(k8s, RAYSERVICES, name), what="the RayService")
    # kopf's finalizer keeps the resource until the operator has cleaned up.
    await eventually(lambda: obj(k8s, LLMSERVICES, name)["metadata"].get("finalizers"))

    response = await k8s.delete(f"{BASE}/{name}")
    assert response.status == 200

    await eventually(lambda: obj(k8s, RAYSERVICES, name) is None, what="the RayService gone")
    await eventually(lambda: obj(k8s, LLMSERVICES, name) is None, what="the LLMService gone")


async def test_invalid_spec_is_degraded_with_a_readable_message(k8s: Any, operator: Any) -> None:
    body = example()
    body["spec"]["platform"]["vllm"]["autoscaling"] = {"min_replicas": 5, "max_replicas": 2}
    name = body["metadata"]["name"]
    await create(k8s, body)

    degraded = await eventually(lambda: condition(obj(k8s, LLMSERVICES, name), "Degraded"))
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "platform.vllm.autoscaling" in degraded["message"]
    assert "min_replicas must not exceed max_replicas" in degraded["message"]
    assert condition(obj(k8s, LLMSERVICES, name), "Ready")["status"] == "False"
    assert obj(k8s, RAYSERVICES, name) is None

    warning = await eventually(
        lambda: [
            e for e in posted_events(k8s) if e["type"] == "Warning" and e["reason"] == "InvalidSpec"
        ]
    )
    assert "min_replicas must not exceed max_replicas" in warning[0]["message"]

    # Fixing the spec recovers without restarting anything: no crash loop, no stuck state.
    await patch(
        k8s,
        name,
        {
            "metadata": {"generation": 2},
            "spec": {"platform": {"vllm": {"autoscaling": {"min_replicas": 1}}}},
        },
    )
    await eventually(lambda: obj(k8s, RAYSERVICES, name), what="the RayService after the fix")
    await eventually(
        lambda: condition(obj(k8s, LLMSERVICES, name), "Degraded")["status"] == "False"
    )
    assert operator.future.done() is False  # the operator is still running


async def test_spec_the_chart_refuses_is_reported_once(k8s: Any, operator: Any) -> None:
    """The chart's checks (here its values schema: an empty image) refuse a spec that parses:
    Degraded with Helm's message, and the status timer does not warn again at every tick."""
    body = example()
    body["spec"]["image"] = ""
    name = body["metadata"]["name"]
    await create(k8s, body)

    degraded = await eventually(lambda: condition(obj(k8s, LLMSERVICES, name), "Degraded"))
    assert degraded["reason"] == "InvalidSpec" and "/image/repository" in degraded["message"]

    def warnings() -> int:
        return sum(e["reason"] == "InvalidSpec" for e in posted_events(k8s))

    await asyncio.sleep(3 * SYNC_INTERVAL_S)  # the create handler and the first tick may race
    before = warnings()
    await asyncio.sleep(10 * SYNC_INTERVAL_S)
    assert warnings() == before >= 1
    assert obj(k8s, RAYSERVICES, name) is None


async def test_rayservice_status_and_metrics_reach_the_llmservice(k8s: Any, operator: Any) -> None:
    healthy = "ray_serve_deployment_replica_healthy"
    metrics = (
        "# TYPE ray_serve_autoscaling_total_requests gauge\n"
        'ray_serve_autoscaling_total_requests{application="vllm",deployment="VLLMServer"} 12.0\n'
        f"# TYPE {healthy} gauge\n"
        f'{healthy}{{application="vllm",deployment="VLLMServer",replica="a"}} 1.0\n'
        f'{healthy}{{application="vllm",deployment="VLLMServer",replica="b"}} 1.0\n'
        f'{healthy}{{application="hf",deployment="HFServer",replica="c"}} 1.0\n'
    )
    k8s["get /metrics/default/qwen"] << metrics.encode()
    body = llmservice("qwen", copy.deepcopy(example()["spec"]))
    await create(k8s, body)
    await eventually(lambda: obj(k8s, RAYSERVICES, "qwen"), what="the RayService")

    # KubeRay reports the service ready (written into the in-memory API as KubeRay would).
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "NonZeroServeEndpoints",
        "message": "serving",
    }
    response = await k8s.patch(
        f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayservices/qwen/status",
        json={"status": {"conditions": [ready], "serviceStatus": "Running"}},
        headers=MERGE,
    )
    assert response.status == 200
    await eventually(lambda: condition(obj(k8s, LLMSERVICES, "qwen"), "Ready")["status"] == "True")
    status = await eventually(
        lambda: (s := obj(k8s, LLMSERVICES, "qwen")["status"]).get("queueDepth") is not None and s
    )
    assert status["queueDepth"] == 12.0 and status["observedReplicas"] == 2
    assert condition(obj(k8s, LLMSERVICES, "qwen"), "Progressing")["status"] == "False"

    # A Serve application that failed to deploy turns into Degraded with KubeRay's message.
    failed = {
        "activeServiceStatus": {
            "applicationStatuses": {
                "vllm": {"status": "DEPLOY_FAILED", "message": "no GPU could be placed"}
            }
        }
    }
    await k8s.patch(
        f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayservices/qwen/status",
        json={
            "status": {**failed, "conditions": [{**ready, "status": "False", "reason": "Failed"}]}
        },
        headers=MERGE,
    )
    degraded = await eventually(
        lambda: (
            (c := condition(obj(k8s, LLMSERVICES, "qwen"), "Degraded"))["status"] == "True" and c
        )
    )
    assert "vllm: DEPLOY_FAILED (no GPU could be placed)" in degraded["message"]

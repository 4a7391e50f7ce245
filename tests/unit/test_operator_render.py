"""Pure parts of the operator: spec validation, the RayService renderer (checked against KubeRay's
CRD schema), the generated CRD, merge patches and the status computed from KubeRay + metrics."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators import crd, kube, status
from operators.render import render_rayservice
from operators.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT.parent / "shared" / "reference" / "crds"  # KubeRay's CRDs, beside the repo
EXAMPLE = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice.yaml").read_text())
OWNER = {
    "apiVersion": "serving.llm-serving.io/v1alpha1",
    "kind": "LLMService",
    "metadata": {"name": "qwen", "uid": "u-1"},
}
NOW = "2026-01-01T00:00:00Z"


def spec(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(EXAMPLE["spec"])
    data.update(changes)
    return data


def worker_group(doc: dict[str, Any]) -> dict[str, Any]:
    (group,) = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group


def test_rendered_rayservice_is_owned_and_carries_the_knobs() -> None:
    doc = render_rayservice("qwen", "team-a", spec(), owner=OWNER)
    assert doc["metadata"]["namespace"] == "team-a"
    assert doc["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "serving.llm-serving.io/v1alpha1",
            "kind": "LLMService",
            "name": "qwen",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    group = worker_group(doc)
    assert (group["groupName"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        "gpu",
        1,
        1,
        4,
    )
    (container,) = group["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/llm-serving/llm-serving-gpu:0.1.0"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "24Gi"}
    serve = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert [app["name"] for app in serve["applications"]] == ["vllm"]  # hf, analysis disabled
    assert serve["applications"][0]["args"]["model"]["ref"] == "Qwen/Qwen2.5-0.5B"
    assert doc["spec"]["serveService"]["metadata"]["name"] == "qwen-api"


def test_zero_gpus_renders_the_cpu_worker_group() -> None:
    cpu_platform = {"vllm": {"resources": {"accelerator": "cpu"}, "num_replicas": 1}}
    doc = render_rayservice(
        "tiny", "ns", spec(gpusPerReplica=0, platform=cpu_platform, resources=None)
    )
    group = worker_group(doc)
    assert group["groupName"] == "cpu"
    assert "tolerations" not in group["template"]["spec"]
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources["limits"] and resources["limits"]["memory"] == "16Gi"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": {"min": 3, "max": 2}}, "workers.min (3) must not exceed workers.max (2)"),
        ({"gpusPerReplica": 0}, "need 4 GPU(s) but gpusPerReplica is 0"),
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
    ],
)
def test_invalid_specs_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**changes))
    assert message in str(err.value)


def test_rendered_rayservice_validates_against_kuberays_crd() -> None:
    if not (CRD_DIR / "ray.io_rayservices.yaml").is_file():
        pytest.skip(f"KubeRay CRD schemas not found in {CRD_DIR} (../shared/reference/crds)")
    from tests.k8s.schemas import crd_errors  # KubeRay's schema, closed against unknown fields

    for changes in ({}, {"gpusPerReplica": 0, "platform": {}}):
        assert crd_errors(render_rayservice("qwen", "ns", spec(**changes), owner=OWNER)) == []


def test_committed_crd_is_generated_from_the_models() -> None:
    assert crd.check_or_write(crd.CRD_PATH, check=True) is None


def test_crd_is_structural_and_shows_the_columns() -> None:
    manifest = crd.crd_manifest()
    version = manifest["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Model", "Ready", "Models", "Replicas", "Queue", "Age"]
    assert version["subresources"] == {"status": {}}

    def untyped(node: Any, path: str) -> list[str]:
        if not isinstance(node, dict):
            return []
        found = [] if "type" in node or node.get("x-kubernetes-int-or-string") else [path]
        for key in ("properties", "additionalProperties", "items"):
            child = node.get(key)
            if not isinstance(child, dict):
                continue
            children = child.items() if key == "properties" else [(key, child)]
            for name, sub in children:
                found += untyped(sub, f"{path}.{name}")
        return found

    schema = version["schema"]["openAPIV3Schema"]
    assert untyped(schema, "") == []
    platform = schema["properties"]["spec"]["properties"]["platform"]
    assert platform["properties"]["vllm"]["properties"]["autoscaling"]["nullable"] is True
    assert "$ref" not in yaml.safe_dump(manifest)


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd.crd_manifest(), "1.33", strict=True)


def test_merge_patch_removes_what_the_desired_state_dropped() -> None:
    current = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    desired = {"a": 1, "b": {"c": 5}, "e": [1]}
    assert kube.merge_patch(current, desired) == {"b": {"c": 5, "d": None}, "e": [1]}
    assert kube.merge_patch(desired, desired) == {}


def test_update_patch_leaves_foreign_labels_alone() -> None:
    desired = render_rayservice("qwen", "ns", spec(), owner=OWNER)
    current = copy.deepcopy(desired)
    current["metadata"]["labels"]["team"] = "a"
    current["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 9
    patch = kube.update_patch(current, desired)
    assert patch == {
        "spec": {
            "rayClusterConfig": {
                "workerGroupSpecs": desired["spec"]["rayClusterConfig"]["workerGroupSpecs"]
            }
        }
    }


METRICS = """
# TYPE ray_serve_autoscaling_total_requests gauge
ray_serve_autoscaling_total_requests{application="vllm",deployment="VLLMServer"} 7.0
ray_serve_autoscaling_total_requests{application="hf",deployment="HFServer"} 3.0
# TYPE ray_serve_deployment_replica_healthy gauge
ray_serve_deployment_replica_healthy{application="vllm",deployment="VLLMServer",replica="a"} 1.0
ray_serve_deployment_replica_healthy{application="vllm",deployment="VLLMServer",replica="b"} 0.0
# TYPE ray_llm_serving_queue_depth gauge
ray_llm_serving_queue_depth{engine="vllm",model="m",deployment="VLLMServer"} 2.0
"""


def test_load_prefers_serves_view_and_counts_healthy_replicas() -> None:
    assert status.load_from_metrics(METRICS) == status.PlatformLoad(queue_depth=7.0, replicas=1)
    engine_only = "\n".join(
        line for line in METRICS.splitlines() if "serve_autoscaling" not in line
    )
    assert status.load_from_metrics(engine_only).queue_depth == 2.0


def test_unreadable_metrics_mean_unknown_not_a_crash() -> None:
    def refuse(url: str) -> str:
        raise ConnectionError(url)

    assert status.read_load("http://127.0.0.1:9/metrics", refuse) is None
    assert status.read_load("u", lambda url: METRICS).replicas == 1


def conditions(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result["conditions"]}


def observed(
    rayservice: dict[str, Any] | None, load: status.PlatformLoad | None = None
) -> dict[str, Any]:
    return status.observed_status("qwen", "ns", parse_spec(spec()), rayservice, load, 3, [], NOW)


def test_status_follows_kuberay() -> None:
    assert conditions(observed(None))["Progressing"] == ("True", "Deploying")
    ready = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints"}]
        }
    }
    result = observed(ready, status.PlatformLoad(4.0, 2))
    assert conditions(result) == {
        "Ready": ("True", "NonZeroServeEndpoints"),
        "Progressing": ("False", "Deployed"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (result["queueDepth"], result["observedReplicas"], result["observedGeneration"]) == (
        4.0,
        2,
        3,
    )
    assert result["endpoint"] == "http://qwen-api.ns.svc.cluster.local:8000/v1"
    assert result["model"] == "Qwen/Qwen2.5-0.5B"
    assert "queueDepth" not in observed(ready)  # not measured: the last numbers stay
    assert observed(ready, status.PlatformLoad(None, None))["queueDepth"] is None  # unreachable
    older = {
        "status": {"serviceStatus": "Running", "pendingServiceStatus": {"rayClusterName": "b"}}
    }
    assert conditions(observed(older))["Progressing"] == ("True", "Upgrading")


def test_failed_application_degrades_with_kuberays_message() -> None:
    failed = {
        "status": {
            "activeServiceStatus": {
                "applicationStatuses": {
                    "vllm": {"status": "DEPLOY_FAILED", "message": "replica crashed"}
                }
            }
        }
    }
    result = observed(failed)
    degraded = next(c for c in result["conditions"] if c["type"] == "Degraded")
    assert (
        degraded["status"] == "True"
        and degraded["message"] == "vllm: DEPLOY_FAILED (replica crashed)"
    )
    assert conditions(result)["Progressing"][0] == "False"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = status.rejected_status("InvalidSpec", "bad", 1, [], "2026-01-01T00:00:00Z")
    again = status.rejected_status(
        "InvalidSpec", "still bad", 2, first["conditions"], "2026-01-02T00:00:00Z"
    )
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"2026-01-01T00:00:00Z"}
    fixed = status.observed_status(
        "qwen", "ns", parse_spec(spec()), None, None, 3, again["conditions"], "2026-01-03T00:00:00Z"
    )
    times = {c["type"]: c["lastTransitionTime"] for c in fixed["conditions"]}
    assert times == {
        "Ready": "2026-01-01T00:00:00Z",
        "Progressing": "2026-01-03T00:00:00Z",
        "Degraded": "2026-01-03T00:00:00Z",
    }


class FakeCustomObjects:
    """Just enough of kubernetes.client.CustomObjectsApi for RayServices (merge patches applied)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        from kubernetes.client import ApiException

        self.calls.append("get")
        if (namespace, name) not in self.objects:
            raise ApiException(status=404)
        return copy.deepcopy(self.objects[namespace, name])

    def get_api_resources(self, group: str, version: str) -> Any:
        """Discovery of ray.io/v1: KubeRay is installed here (not a recorded call)."""
        from types import SimpleNamespace

        return SimpleNamespace(resources=[SimpleNamespace(name="rayservices")])

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        from kubernetes.client import ApiException

        self.calls.append("create")
        if (namespace, body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[namespace, body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append("patch")
        self.objects[namespace, name] = apply_merge_patch(self.objects[namespace, name], body)
        return self.objects[namespace, name]

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> None:
        self.calls.append("delete")
        del self.objects[namespace, name]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def test_apply_creates_patches_to_desired_and_then_leaves_alone() -> None:
    api = FakeCustomObjects()
    services = kube.RayServices(api)
    first = render_rayservice("qwen", "ns", spec(), owner=OWNER)
    assert services.apply(first, owner_uid="u-1")[0] == "created"
    smaller = render_rayservice("qwen", "ns", spec(resources=None, gpusPerReplica=2), owner=OWNER)
    assert services.apply(smaller, owner_uid="u-1")[0] == "patched"
    assert api.objects["ns", "qwen"]["spec"] == smaller["spec"]  # removed fields are gone too
    assert services.apply(smaller, owner_uid="u-1")[0] == "unchanged"


def test_apply_and_delete_leave_a_foreign_rayservice_alone() -> None:
    api = FakeCustomObjects()
    services = kube.RayServices(api)
    foreign = render_rayservice("qwen", "ns", spec())  # e.g. the chart's, no owner reference
    services.apply(foreign, owner_uid=None)
    with pytest.raises(kube.OwnershipError, match="not owned by this LLMService"):
        services.apply(render_rayservice("qwen", "ns", spec(), owner=OWNER), owner_uid="u-1")
    assert services.delete("qwen", "ns", owner_uid="u-1") is False
    assert "delete" not in api.calls and ("ns", "qwen") in api.objects


def test_apply_that_loses_a_create_race_patches_the_winner() -> None:
    """The status timer and the create handler can both see no RayService and both create it."""
    api = FakeCustomObjects()
    services = kube.RayServices(api)
    desired = render_rayservice("qwen", "ns", spec(), owner=OWNER)
    real_get = api.get_namespaced_custom_object
    gets = 0

    def get_that_misses_the_other_create(*args: Any) -> dict[str, Any]:
        nonlocal gets
        gets += 1
        if gets == 1:  # the other handler creates it right after our first look
            api.objects["ns", "qwen"] = copy.deepcopy(desired)
            from kubernetes.client import ApiException

            raise ApiException(status=404)
        return real_get(*args)

    api.get_namespaced_custom_object = get_that_misses_the_other_create  # type: ignore[method-assign]
    action, current = services.apply(desired, owner_uid="u-1")
    assert action == "unchanged" and current["spec"] == desired["spec"]
    assert api.calls.count("create") == 1

"""operators.kube: merge patches, and create-or-patch / delete of RayServices against a fake
CustomObjectsApi (ownership, a lost create race). The RayServices are small hand-made ones:
what the chart renders into them is tests/k8s/test_operator_render.py's."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from operators import kube
from operators.render import operator_labels, owner_reference

OWNER = {
    "apiVersion": "serving.llm-serving.io/v1alpha1",
    "kind": "LLMService",
    "metadata": {"name": "qwen", "uid": "u-1"},
}
Doc = dict[str, Any]


def rayservice(owner: Doc | None = OWNER, max_replicas: int = 4, upgrade: bool = True) -> Doc:
    """A RayService with the metadata operators.render gives it."""
    metadata: Doc = {"name": "qwen", "namespace": "ns", "labels": operator_labels("qwen")}
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    group = {"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": max_replicas}
    spec: Doc = {"rayClusterConfig": {"workerGroupSpecs": [group]}}
    if upgrade:
        spec["upgradeStrategy"] = {"type": "NewCluster"}
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": metadata, "spec": spec}


def test_merge_patch_removes_what_the_desired_state_dropped() -> None:
    current = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    desired = {"a": 1, "b": {"c": 5}, "e": [1]}
    assert kube.merge_patch(current, desired) == {"b": {"c": 5, "d": None}, "e": [1]}
    assert kube.merge_patch(desired, desired) == {}


def test_update_patch_leaves_foreign_labels_alone() -> None:
    desired = rayservice()
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
    first = rayservice()
    assert services.apply(first, owner_uid="u-1")[0] == "created"
    smaller = rayservice(max_replicas=2, upgrade=False)
    assert services.apply(smaller, owner_uid="u-1")[0] == "patched"
    assert api.objects["ns", "qwen"]["spec"] == smaller["spec"]  # removed fields are gone too
    assert services.apply(smaller, owner_uid="u-1")[0] == "unchanged"


def test_apply_and_delete_leave_a_foreign_rayservice_alone() -> None:
    api = FakeCustomObjects()
    services = kube.RayServices(api)
    foreign = rayservice(owner=None)  # e.g. the chart's, no owner reference
    services.apply(foreign, owner_uid=None)
    with pytest.raises(kube.OwnershipError, match="not owned by this LLMService"):
        services.apply(rayservice(), owner_uid="u-1")
    assert services.delete("qwen", "ns", owner_uid="u-1") is False
    assert "delete" not in api.calls and ("ns", "qwen") in api.objects


def test_apply_that_loses_a_create_race_patches_the_winner() -> None:
    """The status timer and the create handler can both see no RayService and both create it."""
    api = FakeCustomObjects()
    services = kube.RayServices(api)
    desired = rayservice()
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

    api.get_namespaced_custom_object = get_that_misses_the_other_create  # type: ignore[method-assign]  # a fake API, patched
    action, current = services.apply(desired, owner_uid="u-1")
    assert action == "unchanged" and current["spec"] == desired["spec"]
    assert api.calls.count("create") == 1

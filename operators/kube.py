"""The operator's Kubernetes calls for the objects it owns, RayServices, NetworkPolicies and
PodDisruptionBudgets (kubernetes client, CustomObjectsApi: its generic paths serve built-in kinds too).

Updates are JSON merge patches computed against the live object, so a field removed from the
LLMService is removed from the RayService too (a plain merge patch would leave it behind)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import kubernetes

RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayservices"
NETPOL_GROUP, NETPOL_VERSION, NETPOL_PLURAL = "networking.k8s.io", "v1", "networkpolicies"
PDB_GROUP, PDB_VERSION, PDB_PLURAL = "policy", "v1", "poddisruptionbudgets"
Applied = Literal["created", "patched", "unchanged"]
_MISSING = object()


class OwnershipError(RuntimeError):
    """A RayService of that name exists but another object (or nobody) controls it."""


class KubeRayMissing(RuntimeError):
    """The cluster serves no ray.io/v1 RayService: KubeRay's CRDs are not installed."""

    def __init__(self) -> None:
        super().__init__(
            "this cluster has no KubeRay CRDs (ray.io/v1 RayService): install the KubeRay "
            "operator (chart kuberay-operator); the LLMService is deployed once they exist"
        )


def merge_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 patch turning `current` into `desired` (null deletes a key; lists replace)."""
    patch: dict[str, Any] = {key: None for key in current.keys() - desired.keys()}
    for key, value in desired.items():
        old = current.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = merge_patch(old, value)
            if sub:
                patch[key] = sub
        elif old != value:
            patch[key] = value
    return patch


def owner_uids(obj: dict[str, Any]) -> set[str]:
    return {ref.get("uid") for ref in obj.get("metadata", {}).get("ownerReferences") or []}


def update_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """What to send so `current` matches `desired`: the whole spec, our labels and owner; labels
    and annotations others put on the object are left alone."""
    patch: dict[str, Any] = {}
    spec = merge_patch(current.get("spec") or {}, desired["spec"])
    if spec:
        patch["spec"] = spec
    meta, want = current.get("metadata") or {}, desired["metadata"]
    labels = {
        k: v for k, v in want.get("labels", {}).items() if (meta.get("labels") or {}).get(k) != v
    }
    if labels:
        patch.setdefault("metadata", {})["labels"] = labels
    if "ownerReferences" in want and meta.get("ownerReferences") != want["ownerReferences"]:
        patch.setdefault("metadata", {})["ownerReferences"] = want["ownerReferences"]
    return patch


class OwnedObjects:
    """Get, create-or-patch and delete one kind of owned object; `api` is injectable for tests."""

    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    kind: ClassVar[str]

    def __init__(self, api: kubernetes.client.CustomObjectsApi | None = None) -> None:
        self._api = api

    @property
    def api(self) -> kubernetes.client.CustomObjectsApi:
        if self._api is None:  # created lazily: kopf's login loads the client's config first
            self._api = kubernetes.client.CustomObjectsApi()
        return self._api

    @property
    def path(self) -> tuple[str, str]:
        return self.group, self.version

    def get(self, name: str, namespace: str) -> dict[str, Any] | None:
        """The object, None when absent."""
        try:
            return self.api.get_namespaced_custom_object(*self.path, namespace, self.plural, name)
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                self.check_kind_served()
                return None
            raise

    def check_kind_served(self) -> None:
        """Raise when the cluster cannot hold the kind at all (404 says either)."""

    def apply(
        self, desired: dict[str, Any], owner_uid: str | None
    ) -> tuple[Applied, dict[str, Any]]:
        """Create the object, or patch it to `desired` when this owner controls it."""
        name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
        current = self.get(name, namespace)
        if current is None:
            try:
                created = self.api.create_namespaced_custom_object(
                    *self.path, namespace, self.plural, desired
                )
                return "created", created
            except kubernetes.client.ApiException as err:
                # 409: created between our get and create (the status timer and the create
                # handler can race on a new LLMService); treat it as existing, not as an error.
                if err.status != 409:
                    raise
                current = self.get(name, namespace)
                if current is None:
                    raise
        if owner_uid is not None and owner_uid not in owner_uids(current):
            raise OwnershipError(
                f"{self.kind} {namespace}/{name} already exists and is not owned by this "
                f"LLMService; rename one of them or delete the {self.kind}"
            )
        patch = update_patch(current, desired)
        if not patch:
            return "unchanged", current
        patched = self.api.patch_namespaced_custom_object(
            *self.path, namespace, self.plural, name, patch
        )
        return "patched", patched

    def delete(self, name: str, namespace: str, owner_uid: str) -> bool:
        """Delete the object if this owner controls it; False when there was nothing to do."""
        current = self.get(name, namespace)
        if current is None or owner_uid not in owner_uids(current):
            return False
        try:
            self.api.delete_namespaced_custom_object(*self.path, namespace, self.plural, name)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
        return True


class RayServices(OwnedObjects):
    """RayServices: a 404 also asks whether KubeRay's CRDs exist at all."""

    group, version, plural, kind = RAY_GROUP, RAY_VERSION, RAY_PLURAL, "RayService"

    def check_kind_served(self) -> None:
        if not self.kuberay_installed():
            raise KubeRayMissing()

    def kuberay_installed(self) -> bool:
        try:
            found = self.api.get_api_resources(RAY_GROUP, RAY_VERSION)
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return any(resource.name == RAY_PLURAL for resource in found.resources or [])


class NetworkPolicies(OwnedObjects):
    """The NetworkPolicy over an LLMService's Ray pods."""

    group, version, plural, kind = NETPOL_GROUP, NETPOL_VERSION, NETPOL_PLURAL, "NetworkPolicy"


class DisruptionBudgets(OwnedObjects):
    """The PodDisruptionBudgets over an LLMService's worker groups."""

    group, version, plural, kind = PDB_GROUP, PDB_VERSION, PDB_PLURAL, "PodDisruptionBudget"


def claim_access_modes(name: str, namespace: str) -> list[str] | None:
    """The access modes of a PersistentVolumeClaim; None when it does not exist (yet)."""
    try:
        claim = kubernetes.client.CoreV1Api().read_namespaced_persistent_volume_claim(
            name, namespace
        )
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return list(claim.spec.access_modes or [])

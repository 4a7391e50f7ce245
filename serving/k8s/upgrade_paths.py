"""Which path a `helm upgrade` takes, computed: render the chart before and after a value changes
and decide as KubeRay and Serve do. KubeRay builds a new RayCluster when its hash of
`rayClusterConfig` changes; otherwise it sends `serveConfigV2` to the running cluster, where Serve
rolls an app whose code version changed and reconfigures the others in place. The README's table
of every value (`upgrade_catalogue`) is generated from `classify`, so it cannot drift from the
templates."""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any

import yaml

from serving.k8s import chart

Values = dict[str, Any]
ObjectKey = tuple[str, str]  # (kind, metadata.name)


class UpgradePath(Enum):
    """From the most to the least disruptive; a change takes the first that applies."""

    RAYSERVICE_REPLACED = "RayService replaced"
    NEW_CLUSTER = "new RayCluster"
    CLUSTER_UPDATED = "RayCluster updated in place"
    APP_ROLLED = "app rolled"
    APP_ADDED_REMOVED = "app added/removed"
    SERVE_IN_PLACE = "serve config in place"
    IGNORED_BY_KUBERAY = "ignored by KubeRay"
    OUTSIDE_RAY = "outside the Ray cluster"
    NOTHING = "nothing"


COST = {
    UpgradePath.RAYSERVICE_REPLACED: "the RayService's name changes: Helm deletes it (and its "
    "cluster) and creates another, so nothing serves until the new cluster is up",
    UpgradePath.NEW_CLUSTER: "with `ray.upgradeStrategy: NewCluster` KubeRay builds a second "
    "RayCluster, its vLLM apps starting at `initial_replicas` (the operator writes the live "
    "count; with the chart, set it), waits until its Serve apps run, switches the API Service, "
    "and deletes the old cluster after the drain deadline: no request dropped, twice the GPUs "
    "meanwhile (`NewClusterWithIncrementalUpgrade`: in steps, less). With `None` nothing is "
    "applied until you recreate the RayService",
    UpgradePath.CLUSTER_UPDATED: "KubeRay updates the running RayCluster (worker groups appended "
    "at the end): its pods stay",
    UpgradePath.APP_ROLLED: "Serve rolls that app's replicas (its code version changed). With "
    "`max_surge_percent` > 0 (default 25: at least one replica) the new replica loads before the "
    "old one stops, which needs room for one more (for vLLM a spare GPU); the other apps keep "
    "their replicas",
    UpgradePath.APP_ADDED_REMOVED: "Serve deploys or deletes that app; the other apps keep their "
    "replicas",
    UpgradePath.SERVE_IN_PLACE: "KubeRay sends the new serve config to the running cluster; Serve "
    "reconfigures the running replicas (same actors, loaded engines kept, no request lost)",
    UpgradePath.IGNORED_BY_KUBERAY: "KubeRay leaves the field out of its hash, so the running "
    "RayCluster keeps the old value until something else builds a new one",
    UpgradePath.OUTSIDE_RAY: "Kubernetes updates objects beside the cluster (Services, PDBs, "
    "NetworkPolicy, monitors, Secrets, the RayService's own settings): no Ray pod or replica "
    "restarts",
    UpgradePath.NOTHING: "no rendered object changes: the value is read only by local runs "
    "(`llm-serving up`) or at install, or unused while another is set (`num_replicas` under "
    "`autoscaling`)",
}


@dataclass(frozen=True)
class Outcome:
    path: UpgradePath
    apps: tuple[str, ...] = ()  # the apps rolled, added or removed

    @property
    def label(self) -> str:
        return f"{self.path.value}: {', '.join(self.apps)}" if self.apps else self.path.value


def kuberay_cluster_hash(cluster_spec: Values) -> str:
    """KubeRay 1.7's hash of a RayService's `rayClusterConfig`: utils/util.go
    GenerateHashWithoutReplicasAndWorkersToDelete over rayservice_controller.go's
    rayClusterSpecForHashing. It mutes what the autoscaler or Kueue change on a live cluster
    (replicas, min/max, workersToDelete, tolerations, scheduling gates), `suspend` and the
    RayCluster's own `upgradeStrategy`. KubeRay hashes its Go struct's JSON (SHA-1); equal
    specs give equal sorted JSON, which is all a comparison needs."""
    spec = copy.deepcopy(cluster_spec)
    spec.pop("suspend", None)
    spec.pop("upgradeStrategy", None)
    _mute_pod_fields(spec.get("headGroupSpec", {}))
    for group in spec.get("workerGroupSpecs") or []:
        for field in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(field, None)
        (group.get("scaleStrategy") or {}).pop("workersToDelete", None)
        if not group.get("scaleStrategy"):  # Go writes the struct as {} with or without it
            group.pop("scaleStrategy", None)
        _mute_pod_fields(group)
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _mute_pod_fields(group: Values) -> None:
    pod_spec = group.get("template", {}).get("spec", {})
    pod_spec.pop("tolerations", None)
    pod_spec.pop("schedulingGates", None)


def cluster_action(before: Values, after: Values) -> UpgradePath | None:
    """What KubeRay does with a changed `rayClusterConfig` (rayservice_controller.go
    shouldPrepareNewCluster / isClusterSpecHashEqual): None when the hashes are equal (the live
    cluster is left alone); an in-place update when the only difference is worker groups
    appended at the end (the old groups hash as before); otherwise a new cluster."""
    if kuberay_cluster_hash(before) == kuberay_cluster_hash(after):
        return None
    old_groups = len(before.get("workerGroupSpecs") or [])
    new_groups = after.get("workerGroupSpecs") or []
    if len(new_groups) >= old_groups:
        kept = {**after, "workerGroupSpecs": new_groups[:old_groups]}
        if kuberay_cluster_hash(kept) == kuberay_cluster_hash(before):
            return UpgradePath.CLUSTER_UPDATED
    return UpgradePath.NEW_CLUSTER


# Deployment options whose change restarts replicas even under the same code version
# (ray.serve._private.version.DeploymentVersion.requires_actor_restart).
RESTARTING_OPTIONS = (
    "ray_actor_options",
    "placement_group_bundles",
    "placement_group_strategy",
    "max_replicas_per_node",
    "gang_scheduling_config",
)


def app_restart_key(app: Values) -> tuple[str, str]:
    """What Serve restarts an app's replicas on: its code version (Ray's own function) and the
    deployment options that force an actor restart."""
    return _restart_key(freeze(app))


@cache  # most changes leave an app as it was: one validation per distinct app
def _restart_key(frozen_app: str) -> tuple[str, str]:
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    app = json.loads(frozen_app)
    with warnings.catch_warnings():  # Ray warns of metrics_interval_s, which 2.60 still reads
        warnings.simplefilter("ignore", DeprecationWarning)
        code_version = get_app_code_version(ServeApplicationSchema.model_validate(app))
    options = [{k: d.get(k) for k in RESTARTING_OPTIONS} for d in app.get("deployments") or []]
    return code_version, json.dumps(options, sort_keys=True)


def serve_outcome(before: Values, after: Values) -> Outcome | None:
    """What Serve does when KubeRay sends `after` to a cluster running `before`."""
    old = {app["name"]: app for app in before.get("applications") or []}
    new = {app["name"]: app for app in after.get("applications") or []}
    rolled = tuple(
        name
        for name in new
        if name in old and app_restart_key(old[name]) != app_restart_key(new[name])
    )
    changed = tuple(sorted(old.keys() ^ new.keys()))
    if rolled:
        return Outcome(
            UpgradePath.APP_ROLLED, rolled + tuple(f"{n} added/removed" for n in changed)
        )
    if changed:
        return Outcome(UpgradePath.APP_ADDED_REMOVED, changed)
    return Outcome(UpgradePath.SERVE_IN_PLACE) if before != after else None


def freeze(values: Values) -> str:
    return json.dumps(values, sort_keys=True)


# libyaml where PyYAML has it: the catalogue parses a few hundred renders.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parsed(text: str) -> Values:
    document: Values = yaml.load(text, Loader=LOADER)
    return document


@cache
def rendered_objects(frozen_values: str) -> dict[ObjectKey, Values]:
    """The chart's objects for the values (JSON, so the cache has a hashable key). Raises
    chart.RenderError."""
    objects = {}
    for name, text in chart.render_templates(json.loads(frozen_values)).items():
        if name.endswith("NOTES.txt"):
            continue
        for document in yaml.load_all(text, Loader=LOADER):
            if document:
                objects[(document["kind"], document["metadata"]["name"])] = chart.masked_password(
                    document
                )
    return objects


def rayservice(objects: dict[ObjectKey, Values]) -> Values:
    (service,) = [obj for (kind, _), obj in objects.items() if kind == "RayService"]
    return service


def classify(before: Values, after: Values) -> Outcome:
    """The path a `helm upgrade` from `before` to `after` (user values) takes."""
    old_objects, new_objects = rendered_objects(freeze(before)), rendered_objects(freeze(after))
    old, new = rayservice(old_objects), rayservice(new_objects)
    if old["metadata"]["name"] != new["metadata"]["name"]:
        return Outcome(UpgradePath.RAYSERVICE_REPLACED)
    old_spec, new_spec = old["spec"], new["spec"]
    action = cluster_action(old_spec["rayClusterConfig"], new_spec["rayClusterConfig"])
    if action:
        return Outcome(action)
    serve = serve_outcome(parsed(old_spec["serveConfigV2"]), parsed(new_spec["serveConfigV2"]))
    if serve:
        return serve
    if old_spec["rayClusterConfig"] != new_spec["rayClusterConfig"]:
        return Outcome(UpgradePath.IGNORED_BY_KUBERAY)
    return Outcome(UpgradePath.OUTSIDE_RAY if old_objects != new_objects else UpgradePath.NOTHING)

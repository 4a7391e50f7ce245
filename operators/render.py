"""LLMService -> KubeRay RayService: the chart (helm/llm-serving) renders it, with Helm's own engine.

One renderer: an LLMService's knobs become chart values (`chart_values`, pure), the chart renders
them as the release named after the LLMService, and the operator takes the RayService and puts
its own metadata on it (labels, owner, namespace). Knobs -> values: image -> image.repository:tag,
gpusPerReplica -> workers.gpu.gpusPerWorker (0: the workers.cpu group instead; a GPU LLMService
keeps the chart's CPU group only for apps on the CPU), workers.min/max -> replicas = minReplicas /
maxReplicas (min unset: the chart's, whose GPU minimum is 0 when every GPU app may scale to zero),
resources -> the group's resources, pods.{nodeSelector,tolerations,runtimeClassName,
priorityClassName} -> that group's fields, pods.imagePullSecrets -> imagePullSecrets,
pods.hfTokenSecret -> model.hfToken.existingSecret/key, pods.modelCacheClaim ->
model.cache.persistentVolumeClaim.existingClaim, apiKeySecret -> apiKeys.existingSecret/key,
tenantKeySecrets -> tenantKeys (each tenant's existingSecret/key), stateSecret ->
state.existingSecret/secretKey (the chart's own PostgreSQL is off: the store is the server
platform.state.url names, or SQLite in each pod without one), upgradeStrategy ->
ray.upgradeStrategy, rayAuth -> ray.auth.mode, networkPolicy -> networkPolicy.enabled (the
operator's pods added to metricsFrom), platform -> platform (as written). Everything else is
the chart's default; whatever the chart would create beside the RayService and its NetworkPolicy
is switched off."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

from operators.spec import GROUP, KIND, VERSION, LLMServiceSpec, SpecError, parse_spec
from serving.config import VLLMReplicaSettings
from serving.config import apps as registry
from serving.k8s import chart
from serving.k8s.serve_config import vllm_deployments

MANAGED_BY = "llm-serving-operator"
INSTANCE_LABEL = f"{GROUP}/llmservice"
Doc = dict[str, Any]

# Chart objects beside the RayService, its NetworkPolicy and its workers' PodDisruptionBudgets:
# the operator owns none of them, so none is rendered. The operator checks for KubeRay itself
# (kube.KubeRayMissing) and scrapes KubeRay's head Service.
NOTHING_ELSE: Doc = {
    "kuberay": {"checkOperator": False},
    "services": {"dashboard": {"enabled": False}, "metrics": {"enabled": False}},
    "ingress": {"enabled": False},
    "monitoring": {
        "serviceMonitor": {"enabled": False},
        "podMonitor": {"enabled": False},
        "grafanaDashboard": {"enabled": False},
    },
    "devicePlugin": {"enabled": False},
    "podDisruptionBudget": {"head": {"enabled": False}},  # the workers' budgets are owned
    "operator": {"enabled": False},
    "helmTest": {"enabled": False},
}


# The operator's pods (the chart's templates/operator.yaml): it scrapes each head's metrics port,
# so the NetworkPolicy of an LLMService lets it in beside the chart's metricsFrom.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "llm-serving-operator"}
OPERATOR_PEER: Doc = {"namespaceSelector": {}, "podSelector": {"matchLabels": OPERATOR_POD_LABELS}}


def api_service_name(name: str) -> str:
    """The Service KubeRay points at the serving RayCluster (the chart's `<fullname>-api`)."""
    return f"{name}-api"


def operator_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, INSTANCE_LABEL: name}


def owner_reference(owner: Doc) -> Doc:
    """Makes the RayService a dependent of its LLMService: Kubernetes' garbage collector deletes it
    with the owner, and `controller` marks which object reconciles it."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": owner.get("kind", KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def exactly(default: Any, desired: Any) -> Any:
    """Values that Helm coalesces onto the chart's `default` into `desired` itself: Helm merges
    maps into the chart's, so each default key `desired` leaves out is nulled (null deletes it)."""
    if not (isinstance(default, dict) and isinstance(desired, dict)):
        return desired
    nulled = {key: None for key in default.keys() - desired.keys()}
    return nulled | {key: exactly(default.get(key), value) for key, value in desired.items()}


LATEST_PULL = {"latest": {"pullPolicy": "Always"}}


def image_values(image: str) -> Doc:
    """Split at the tag's colon (not a registry port's), so the chart's `repository:tag` is the
    image as written. No tag means `latest`, which is pulled `Always`, as Kubernetes defaults it:
    the chart's IfNotPresent would keep each node's first `latest` for good."""
    repository, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        repository, tag = image, "latest"
    return {"repository": repository, "tag": tag} | LATEST_PULL.get(tag, {})


def needs_cpu_group(spec: LLMServiceSpec) -> bool:
    """GPU workers run only vLLM: enabled apps on the CPU need a CPU group beside them, the
    router of `models` included (replicas on the CPU require the CPU group's resource)."""
    config = spec.platform
    accelerators = [d.resources.accelerator for d in vllm_deployments(config)]
    if config.models and config.vllm.enabled:
        accelerators.append("cpu")
    for app in registry.apps_of(config):
        settings = getattr(config, app.name)
        if app.name != "vllm" and settings.enabled:
            accelerators.append(settings.resources.accelerator)
    return bool(spec.gpus_per_replica) and "cpu" in accelerators


def group_values(spec: LLMServiceSpec, default: Doc) -> Doc:
    """The LLMService's worker group; `default` is the chart's group of the same kind."""
    pods = spec.pods
    bounds = spec.workers
    group: Doc = {
        "enabled": True,
        # Unset: the chart's (one pod at start; the fewest follows the GPU apps' min_replicas).
        **({} if bounds.min is None else {"replicas": bounds.min, "minReplicas": bounds.min}),
        "maxReplicas": bounds.max,
        "nodeSelector": exactly(default["nodeSelector"], pods.node_selector),
        "runtimeClassName": pods.runtime_class_name or "",
        "priorityClassName": pods.priority_class_name or "",
    }
    if spec.resources is not None:  # unset: the chart's; set: these and nothing else
        given = spec.resources.model_dump(exclude_defaults=True)
        group["resources"] = exactly(default["resources"], given)
    if pods.tolerations is not None:  # unset: the chart's (the GPU taint on GPU workers)
        group["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in pods.tolerations
        ]
    return group


def workers_values(spec: LLMServiceSpec, defaults: Doc) -> Doc:
    if not spec.gpus_per_replica:
        return {"cpu": group_values(spec, defaults["cpu"]), "gpu": {"enabled": False}}
    gpu = group_values(spec, defaults["gpu"]) | {"gpusPerWorker": spec.gpus_per_replica}
    return {"gpu": gpu, "cpu": {"enabled": needs_cpu_group(spec)}}


def secret_values(spec: LLMServiceSpec) -> Doc:
    """Secrets and the model cache claim the LLMService names; the chart creates none itself."""
    token, keys, claim = spec.pods.hf_token_secret, spec.api_key_secret, spec.pods.model_cache_claim
    hf_token: Doc = {"existingSecret": "", "value": ""}
    if token is not None:
        hf_token |= {"existingSecret": token.name, "key": token.key}
    api_keys: Doc = {"existingSecret": "", "value": ""}
    if keys is not None:
        api_keys |= {"existingSecret": keys.name, "key": keys.key}
    tenant_keys = {
        tenant: {"existingSecret": ref.name, "key": ref.key}
        for tenant, ref in spec.tenant_key_secrets.items()
    }
    cache = {"persistentVolumeClaim": {"enabled": bool(claim), "existingClaim": claim or ""}}
    return {
        "model": {"hfToken": hf_token, "cache": cache},
        "apiKeys": api_keys,
        "tenantKeys": tenant_keys,
    }


def state_values(spec: LLMServiceSpec) -> Doc:
    """The store: the server platform.state.url names, with stateSecret's password; no server of
    the chart's (the operator owns no StatefulSet). Without a URL each pod keeps its own SQLite
    file, as an LLMService did before the store existed (the CRD's stateSecret says so)."""
    secret = spec.state_secret
    state: Doc = {"postgresql": {"enabled": False}, "allowUnshared": True, "existingSecret": ""}
    if secret is not None:
        state |= {"existingSecret": secret.name, "secretKey": secret.key}
    return state


def cache_claim_problem(spec: LLMServiceSpec, modes: list[str] | None) -> str | None:
    """The chart's rule for a model cache claim (templates/_validate.tpl, modelCache), with the
    claim's access modes read from the API (the operator renders offline, where Helm's lookup is
    empty): a claim one node mounts cannot serve worker pods on several."""
    claim = spec.pods.model_cache_claim
    if not claim or not modes or "ReadWriteMany" in modes:
        return None
    workers = workers_values(spec, chart_defaults()["workers"])
    defaults = chart_defaults()["workers"]
    pods = sum(
        int(group.get("maxReplicas", defaults[key]["maxReplicas"]))
        for key, group in workers.items()
        if group.get("enabled")
    ) * (1 if spec.upgrade_strategy == "None" else 2)  # a new cluster mounts it beside the old
    if pods <= 1:
        return None
    return (
        f"pods.modelCacheClaim: claim {claim} has access modes {modes}, which let one node mount "
        f"it, but up to {pods} worker pods may (workers.max, twice during an upgrade that builds "
        "a new RayCluster); pods on another node would hang in ContainerCreating. Use a "
        "ReadWriteMany claim (EFS, Filestore, Azure Files, NFS), or leave modelCacheClaim unset "
        "(an emptyDir per pod)"
    )


def network_policy_values(spec: LLMServiceSpec, defaults: Doc) -> Doc:
    """The chart's NetworkPolicy over the Ray pods, the operator's own pods let in to scrape."""
    if not spec.network_policy:
        return {"enabled": False}
    return {"enabled": True, "metricsFrom": [*defaults["metricsFrom"], OPERATOR_PEER]}


def starting_at_live_replicas(spec: LLMServiceSpec, live: Mapping[str, int]) -> Doc:
    """The platform as written, each autoscaled vLLM deployment starting at the replicas serving
    now (`live`: healthy replicas per Serve app). A change that builds a new RayCluster then starts
    it at today's capacity, not at min_replicas: KubeRay switches traffic to it as soon as its apps
    are RUNNING. Counts at or below min_replicas add nothing; an initial_replicas written wins."""
    config = spec.platform
    written = spec.platform.model_dump(mode="json", exclude_unset=True)
    sections: list[tuple[str, VLLMReplicaSettings, Doc]] = [
        ("vllm", config.vllm, written.get("vllm", {}))
    ]
    if config.models:
        sections = [(e.app_name, e, written["models"][i]) for i, e in enumerate(config.models)]
    for app, settings, section in sections:
        scaling = settings.autoscaling
        if scaling is None or scaling.initial_replicas is not None or not config.vllm.enabled:
            continue
        count = min(live.get(app, 0), scaling.max_replicas)
        if count > scaling.min_replicas:
            section["autoscaling"]["initial_replicas"] = count
    return written


def ray_values(spec: LLMServiceSpec) -> Doc:
    ray: Doc = {"upgradeStrategy": spec.upgrade_strategy, "auth": {"mode": spec.ray_auth}}
    if spec.incremental_upgrade is not None:
        ray["incrementalUpgrade"] = spec.incremental_upgrade.model_dump(by_alias=True)
    return ray


def chart_values(
    name: str, spec: LLMServiceSpec, defaults: Doc, live: Mapping[str, int] | None = None
) -> Doc:
    """The chart values that render the LLMService's RayService; `defaults` are the chart's. The
    platform goes as written (the apps read their part as `args`), none of the chart's added,
    except where the vLLM deployments start (`starting_at_live_replicas`)."""
    written = starting_at_live_replicas(spec, live or {})
    return {
        "fullnameOverride": name,
        "image": image_values(spec.image),
        "imagePullSecrets": [secret.model_dump() for secret in spec.pods.image_pull_secrets],
        "serviceAccount": {"create": False, "name": ""},  # pods run as the namespace's default
        "ray": ray_values(spec),
        "platform": exactly(defaults["platform"], written),
        "workers": workers_values(spec, defaults["workers"]),
        "networkPolicy": network_policy_values(spec, defaults["networkPolicy"]),
        **secret_values(spec),
        "state": state_values(spec),
        **NOTHING_ELSE,
    }


@functools.cache
def chart_defaults() -> Doc:
    """The chart's default values, read once: the chart does not change under a running operator."""
    return chart.merged_values()


def owned(doc: Doc, name: str, namespace: str, owner: Doc | None) -> Doc:
    """A chart object as the operator's: its namespace, labels and owner."""
    meta = doc["metadata"]
    meta["namespace"] = namespace
    meta["labels"] = meta.get("labels", {}) | operator_labels(name)
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return doc


def with_operator_metadata(rayservice: Doc, name: str, namespace: str, owner: Doc | None) -> Doc:
    """The chart's RayService as the operator's. The names are set too: the chart cuts its
    fullname at 40 characters, KubeRay takes 47 (spec.MAX_NAME_LENGTH), and the operator finds
    the RayService and its API Service by the LLMService's name."""
    rayservice["metadata"]["name"] = name
    service = rayservice["spec"]["serveService"]["metadata"]
    service["name"] = api_service_name(name)
    service["labels"] = service.get("labels", {}) | operator_labels(name)
    return owned(rayservice, name, namespace, owner)


def network_policy_name(name: str) -> str:
    return f"{name}-ray"


def budget_names(name: str) -> tuple[str, ...]:
    """Every PodDisruptionBudget an LLMService's workers may have (the chart's
    `<fullname>-<group>-workers`, one per group with minReplicas > 0)."""
    return tuple(f"{name}-{group}-workers" for group in ("gpu", "cpu"))


class Owned(NamedTuple):
    rayservice: Doc
    network_policy: Doc | None  # None with networkPolicy off
    budgets: list[Doc]  # one per worker group with workers.min > 0


def render_owned(
    name: str,
    namespace: str,
    spec: LLMServiceSpec | Doc,
    owner: Doc | None = None,
    live: Mapping[str, int] | None = None,
) -> Owned:
    """What an LLMService owns: its RayService, NetworkPolicy and the workers'
    PodDisruptionBudgets (a node drain never takes a group below workers.min); raises SpecError on
    an invalid spec, or with Helm's message when the chart refuses the values (its schema, its
    validation). `live`: healthy replicas per vLLM app now."""
    typed = spec if isinstance(spec, LLMServiceSpec) else parse_spec(spec)
    values = chart_values(name, typed, chart_defaults(), live)
    try:
        docs = chart.render_documents(values, release=name, namespace=namespace)
    except chart.RenderError as err:
        raise SpecError(f"the chart refused the spec: {str(err).strip()}") from None
    (rayservice,) = [doc for doc in docs if doc["kind"] == "RayService"]
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    for policy in policies:
        policy["metadata"]["name"] = network_policy_name(name)
        owned(policy, name, namespace, owner)
    budgets = [owned(d, name, namespace, owner) for d in docs if d["kind"] == "PodDisruptionBudget"]
    rayservice = with_operator_metadata(rayservice, name, namespace, owner)
    return Owned(rayservice, next(iter(policies), None), budgets)


def render_rayservice(
    name: str, namespace: str, spec: LLMServiceSpec | Doc, owner: Doc | None = None
) -> Doc:
    """The RayService an LLMService owns (render_owned's first part)."""
    return render_owned(name, namespace, spec, owner)[0]

"""LLMService -> KubeRay RayService manifest: pure functions, no API calls.

The chart (helm/llm-serving/templates/rayservice.yaml, _pod.tpl) is the reference: this module
renders the same spec for the same platform config and cluster knobs, with the chart's defaults
(operators.defaults) for the rest; tests/k8s/test_operator_matches_chart.py holds them equal.
Knobs -> chart values: image -> image.repository:tag, gpusPerReplica -> workers.gpu.gpusPerWorker
(0 -> the workers.cpu group instead), workers.min/max -> replicas = minReplicas / maxReplicas,
resources -> the group's resources, pods.{nodeSelector,tolerations,runtimeClassName,
priorityClassName} -> that group's fields, pods.imagePullSecrets -> imagePullSecrets,
pods.hfTokenSecret -> model.hfToken.existingSecret/key, pods.modelCacheClaim ->
model.cache.persistentVolumeClaim.existingClaim, upgradeStrategy -> ray.upgradeStrategy; the
LLMService name plays the release name and fullname."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

import yaml

from operators import defaults as d
from operators.spec import GROUP, KIND, VERSION, LLMServiceSpec, parse_spec
from serving.config import API_KEYS_ENV, PlatformConfig, ray_env
from serving.k8s.serve_config import (
    gpu_replica_cpus,
    serve_config_v2,
    served_model_refs,
    vllm_deployments,
)

MANAGED_BY = "llm-serving-operator"
INSTANCE_LABEL = f"{GROUP}/llmservice"
Doc = dict[str, Any]


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": d.CHART_NAME,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        INSTANCE_LABEL: name,
    }


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


def api_service_name(name: str) -> str:
    """The Service KubeRay points at the serving RayCluster (the chart's `<fullname>-api`)."""
    return f"{name}-api"


def model_env(spec: LLMServiceSpec) -> list[Doc]:
    env = [
        {"name": "HF_HOME", "value": f"{d.MODEL_CACHE_PATH}/huggingface"},
        {"name": "LLM_SERVING_CACHE", "value": f"{d.MODEL_CACHE_PATH}/llm-serving"},
    ]
    token = spec.pods.hf_token_secret
    if token is not None:  # a file, not an env var: huggingface_hub reads HF_TOKEN_PATH
        env.append({"name": "HF_TOKEN_PATH", "value": f"{d.HF_TOKEN_DIR}/{token.key}"})
    return env


def ray_container_env(spec: LLMServiceSpec) -> list[Doc]:
    return [{"name": k, "value": v} for k, v in ray_env(spec.platform).items()] + model_env(spec)


def api_keys_env(spec: LLMServiceSpec) -> list[Doc]:
    """The chart's apiKeys.existingSecret: the keys, in the variable the platform config names."""
    secret = spec.api_key_secret
    if secret is None:
        return []
    name = spec.platform.auth.api_keys_env or API_KEYS_ENV
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}]


def model_mounts(spec: LLMServiceSpec) -> list[Doc]:
    mounts: list[Doc] = [{"name": "model-cache", "mountPath": d.MODEL_CACHE_PATH}]
    if spec.pods.hf_token_secret is not None:
        mounts.append({"name": "hf-token", "mountPath": d.HF_TOKEN_DIR, "readOnly": True})
    return mounts


def pod_volumes(spec: LLMServiceSpec, role: str) -> list[Doc]:
    """The model cache (the shared claim on workers when there is one; the head runs no
    replicas, so it never holds it) and the token Secret."""
    claim = spec.pods.model_cache_claim
    if claim and role != "head":
        cache: Doc = {"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}}
    else:
        cache = {"name": "model-cache", "emptyDir": {"sizeLimit": d.MODEL_CACHE_SIZE_LIMIT}}
    volumes = [cache]
    token = spec.pods.hf_token_secret
    if token is not None:
        secret = {"secretName": token.name, "defaultMode": d.HF_TOKEN_MODE}
        volumes.append({"name": "hf-token", "secret": secret})
    return volumes


def worker_placement(spec: LLMServiceSpec) -> Doc:
    """Pod spec fields that place the LLMService's worker group (chart: workers.<group>.*)."""
    pods = spec.pods
    tolerations = (
        [t.model_dump(by_alias=True, exclude_none=True) for t in pods.tolerations]
        if pods.tolerations is not None
        else (d.GPU_TOLERATIONS if spec.gpus_per_replica else [])
    )
    placement = {
        "runtimeClassName": pods.runtime_class_name,
        "priorityClassName": pods.priority_class_name,
        "nodeSelector": pods.node_selector,
        "tolerations": tolerations,
    }
    return {key: value for key, value in placement.items() if value}


def ports(config: PlatformConfig, role: str) -> list[Doc]:
    head = [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": d.DASHBOARD_PORT},
        {"name": "client", "containerPort": 10001},
    ]
    own = [
        {"name": "serve", "containerPort": config.http.port},
        {"name": "metrics", "containerPort": d.METRICS_PORT},
    ]
    return (head if role == "head" else []) + own


def probes(role: str) -> Doc:
    """Liveness never looks at the model: a replica loading weights never restarts its pod."""
    if role == "head":
        live = ready = {"path": "/api/gcs_healthz", "port": "dashboard"}
    else:
        live, ready = (
            {"path": "/api/local_raylet_healthz", "port": 52365},
            {"path": "/-/healthz", "port": "serve"},
        )
    return {
        "startupProbe": {"httpGet": live, **d.PROBE_TIMINGS["startup"]},
        "livenessProbe": {"httpGet": live, **d.PROBE_TIMINGS["liveness"]},
        "readinessProbe": {"httpGet": ready, **d.PROBE_TIMINGS["readiness"]},
    }


def ray_container(spec: LLMServiceSpec, role: str, resources: Doc) -> Doc:
    return {
        "name": f"ray-{role}",
        "image": spec.image,
        "imagePullPolicy": d.PULL_POLICY,
        "ports": ports(spec.platform, role),
        "env": ray_container_env(spec) + api_keys_env(spec),
        "resources": resources,
        "securityContext": d.CONTAINER_SECURITY_CONTEXT,
        **probes(role),
        "volumeMounts": model_mounts(spec),
    }


def prefetch_container(spec: LLMServiceSpec) -> Doc:
    """Downloads (or builds) every served model before Ray starts on a worker; a cached model is
    found. Demo adapters are built by each replica as it starts (into the same cache)."""
    return {
        "name": "prefetch-model",
        "image": spec.image,
        "imagePullPolicy": d.PULL_POLICY,
        "command": ["python", "-c", d.PREFETCH_SCRIPT, *served_model_refs(spec.platform)],
        "env": model_env(spec),
        "resources": d.PREFETCH_RESOURCES,
        "securityContext": d.CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": model_mounts(spec),
    }


def pod_template(
    name: str,
    spec: LLMServiceSpec,
    role: str,
    resources: Doc,
    placement: Doc,
    annotations: dict[str, str] | None = None,
) -> Doc:
    pod: Doc = {}
    if role != "head":
        pod["automountServiceAccountToken"] = False  # only the head's autoscaler uses the API
    pod["securityContext"] = d.POD_SECURITY_CONTEXT
    pod.update(placement)
    if spec.pods.image_pull_secrets:
        pod["imagePullSecrets"] = [s.model_dump() for s in spec.pods.image_pull_secrets]
    if role != "head":
        pod["initContainers"] = [prefetch_container(spec)]
    pod["containers"] = [ray_container(spec, role, resources)]
    pod["volumes"] = pod_volumes(spec, role)
    pod_labels = {
        "app.kubernetes.io/part-of": d.CHART_NAME,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": f"ray-{role}",
    }
    metadata: Doc = {"labels": pod_labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod}


def worker_resources(spec: LLMServiceSpec) -> Doc:
    kind = "gpu" if spec.gpus_per_replica else "cpu"
    given = (
        spec.resources.model_dump(exclude_defaults=True)
        if spec.resources
        else d.WORKER_RESOURCES[kind]
    )
    resources = {key: dict(value) for key, value in given.items()}
    if spec.gpus_per_replica:  # the device plugin schedules on the limit; requests follow it
        resources["limits"] = {**resources.get("limits", {}), d.GPU_RESOURCE: spec.gpus_per_replica}
    return resources


def gpu_ray_start_params(spec: LLMServiceSpec) -> dict[str, str]:
    """GPU workers advertise only the CPUs their vLLM replicas reserve: CPU-only replicas (a CPU
    copy of the model each) go to the CPU group, never beside vLLM (the chart does the same)."""
    per_replica = gpu_replica_cpus(spec.platform)
    return {"num-cpus": str(math.ceil(per_replica * spec.gpus_per_replica))}


def worker_group(name: str, spec: LLMServiceSpec) -> Doc:
    kind = "gpu" if spec.gpus_per_replica else "cpu"
    return {
        "groupName": d.WORKER_GROUP[kind],
        "replicas": spec.workers.min,
        "minReplicas": spec.workers.min,
        "maxReplicas": spec.workers.max,
        "rayStartParams": gpu_ray_start_params(spec) if kind == "gpu" else {},
        "template": pod_template(
            name, spec, "worker", worker_resources(spec), worker_placement(spec)
        ),
    }


def needs_cpu_group(spec: LLMServiceSpec) -> bool:
    """GPU workers run only vLLM: enabled apps on the CPU need a CPU group beside them."""
    config = spec.platform
    apps = [*vllm_deployments(config)]
    apps += [app for app in (config.hf, config.analysis) if app.enabled]
    return bool(spec.gpus_per_replica) and any(app.resources.accelerator == "cpu" for app in apps)


def cpu_app_group(name: str, spec: LLMServiceSpec) -> Doc:
    resources = d.WORKER_RESOURCES["cpu"]
    return {
        "groupName": d.WORKER_GROUP["cpu"],
        **d.CPU_APP_GROUP,
        "rayStartParams": {},
        "template": pod_template(name, spec, "worker", resources, {}),
    }


def worker_groups(name: str, spec: LLMServiceSpec) -> list[Doc]:
    groups = [worker_group(name, spec)]
    if needs_cpu_group(spec):
        groups.append(cpu_app_group(name, spec))
    return groups


def worker_scaling_hash(groups: list[Doc]) -> str:
    """KubeRay leaves worker replicas/min/max/tolerations out of its cluster hash; their hash on
    the head template turns a change of them into a new RayCluster (as the chart does; Go's
    json.Marshal: sorted keys, no spaces)."""
    scaling = [
        {
            "group": g["groupName"],
            "replicas": g["replicas"],
            "min": g["minReplicas"],
            "max": g["maxReplicas"],
            "tolerations": g["template"]["spec"].get("tolerations", []),
        }
        for g in groups
    ]
    text = json.dumps(scaling, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def serve_service(name: str, config: PlatformConfig) -> Doc:
    return {
        "metadata": {"name": api_service_name(name), "labels": labels(name)},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": "serve", "port": config.http.port, "targetPort": "serve"}],
        },
    }


def rayservice_spec(name: str, spec: LLMServiceSpec) -> Doc:
    config = spec.platform
    groups = worker_groups(name, spec)
    head_annotations = {d.WORKER_SCALING_ANNOTATION: worker_scaling_hash(groups)}
    return {
        "upgradeStrategy": {"type": spec.upgrade_strategy},
        "serveConfigV2": yaml.safe_dump(serve_config_v2(config), sort_keys=False),
        "serveService": serve_service(name, config),
        "rayClusterConfig": {
            "rayVersion": d.RAY_VERSION,
            # KubeRay's autoscaler adds a worker pod when Serve cannot place a replica.
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {
                **d.AUTOSCALER,
                "imagePullPolicy": d.PULL_POLICY,
                "securityContext": d.CONTAINER_SECURITY_CONTEXT,
            },
            "headGroupSpec": {
                "rayStartParams": d.HEAD_RAY_START_PARAMS,
                "template": pod_template(
                    name, spec, "head", d.HEAD_RESOURCES, {}, head_annotations
                ),
            },
            "workerGroupSpecs": groups,
        },
    }


def render_rayservice(
    name: str, namespace: str, spec: LLMServiceSpec | Doc, owner: Doc | None = None
) -> Doc:
    """The RayService an LLMService owns; raises SpecError on an invalid spec."""
    typed = spec if isinstance(spec, LLMServiceSpec) else parse_spec(spec)
    metadata: Doc = {"name": name, "namespace": namespace, "labels": labels(name)}
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    document = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": metadata,
        "spec": rayservice_spec(name, typed),
    }
    return copy.deepcopy(document)  # no dict shared with operators.defaults or another render

"""LLMService -> KubeRay RayService manifest: pure functions, no API calls.

The RayService must equal what the Helm chart renders for the same platform config and cluster
knobs (tests/k8s/test_operator_matches_chart.py proves it), so names, ports and layout follow
helm/llm-serving/templates/rayservice.yaml."""

from __future__ import annotations

from typing import Any

import yaml

from operators.spec import GROUP, KIND, VERSION, LLMServiceSpec, parse_spec
from serving.config import PlatformConfig, ray_env

RAY_VERSION = "2.60.0"  # must match ray[serve] in pyproject.toml and the image
GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = "llm-serving-operator"
INSTANCE_LABEL = f"{GROUP}/llmservice"


def serve_config_v2(config: PlatformConfig) -> dict[str, Any]:
    """Serve's config file content (TEMPORARY until serving.k8s.serve_config_v2 lands)."""
    args = config.model_dump(mode="json")
    apps = (("vllm", config.vllm), ("hf", config.hf), ("analysis", config.analysis))
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": config.http.port},
        "applications": [
            {"name": n, "route_prefix": d.route_prefix, "import_path": f"serving.app:{n}_app", "args": args}
            for n, d in apps
            if d.enabled
        ],
    }


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llm-serving",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        INSTANCE_LABEL: name,
    }


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
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


def env_list(config: PlatformConfig) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(ray_env(config).items())]


def head_ports(config: PlatformConfig) -> list[dict[str, Any]]:
    """KubeRay finds the dashboard, Serve and metrics ports by these names."""
    return [
        {"name": "gcs-server", "containerPort": 6379},
        {"name": "dashboard", "containerPort": config.ray.dashboard_port},
        {"name": "client", "containerPort": 10001},
        {"name": "serve", "containerPort": config.http.port},
        {"name": "metrics", "containerPort": config.ray.metrics_export_port},
    ]


def worker_resources(spec: LLMServiceSpec) -> dict[str, Any]:
    requests = dict(spec.resources.requests)
    limits = dict(spec.resources.limits)
    if spec.gpus_per_replica:
        # Extended resources must be equal in requests and limits; the device plugin reads limits.
        requests[GPU_RESOURCE] = spec.gpus_per_replica
        limits[GPU_RESOURCE] = spec.gpus_per_replica
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def head_group(spec: LLMServiceSpec) -> dict[str, Any]:
    config = spec.platform
    return {
        "rayStartParams": {
            "num-gpus": "0",  # replicas go to GPU workers, never to the head
            "metrics-export-port": str(config.ray.metrics_export_port),
        },
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-head",
                        "image": spec.image,
                        "env": env_list(config),
                        "ports": head_ports(config),
                    }
                ]
            }
        },
    }


def worker_group(spec: LLMServiceSpec) -> dict[str, Any]:
    config = spec.platform
    pod: dict[str, Any] = {
        "containers": [
            {
                "name": "ray-worker",
                "image": spec.image,
                "env": env_list(config),
                "resources": worker_resources(spec),
            }
        ]
    }
    if spec.gpus_per_replica:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "groupName": "gpu-workers",
        "replicas": spec.workers.min,
        "minReplicas": spec.workers.min,
        "maxReplicas": spec.workers.max,
        "rayStartParams": {"metrics-export-port": str(config.ray.metrics_export_port)},
        "template": {"spec": pod},
    }


def rayservice_spec(spec: LLMServiceSpec) -> dict[str, Any]:
    return {
        "serveConfigV2": yaml.safe_dump(serve_config_v2(spec.platform), sort_keys=False),
        "rayClusterConfig": {
            "rayVersion": RAY_VERSION,
            # KubeRay's autoscaler adds a GPU worker when a replica cannot be placed.
            "enableInTreeAutoscaling": True,
            "headGroupSpec": head_group(spec),
            "workerGroupSpecs": [worker_group(spec)],
        },
    }


def render_rayservice(
    name: str,
    namespace: str,
    spec: LLMServiceSpec | dict[str, Any],
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The RayService an LLMService owns; raises SpecError on an invalid spec."""
    typed = spec if isinstance(spec, LLMServiceSpec) else parse_spec(spec)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels(name)}
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": metadata,
        "spec": rayservice_spec(typed),
    }

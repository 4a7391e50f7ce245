"""The chart's defaults (helm/llm-serving/values.yaml) for everything an LLMService does not set:
probes, security contexts, the head, KubeRay's autoscaler, the model cache and its prefetch.
tests/k8s/test_operator_matches_chart.py renders the chart and holds the operator's RayService
equal to it, so a change of values.yaml that is not made here too fails a test."""

from __future__ import annotations

from typing import Any

CHART_NAME = "llm-serving"
RAY_VERSION = "2.60.0"  # values.yaml ray.version; must match ray[serve] in pyproject.toml
PULL_POLICY = "IfNotPresent"
GPU_RESOURCE = "nvidia.com/gpu"
METRICS_PORT = 8080  # Ray's metrics export port on every Ray pod (the chart's "metrics" port)
DASHBOARD_PORT = 8265

HEAD_RAY_START_PARAMS = {"num-cpus": "0", "dashboard-host": "0.0.0.0"}  # no replicas on the head
HEAD_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "2", "memory": "8Gi"},
    "limits": {"cpu": "2", "memory": "8Gi"},
}
WORKER_GROUP = {"gpu": "gpu", "cpu": "cpu"}  # groupName by kind of worker
WORKER_RESOURCES: dict[str, dict[str, Any]] = {
    "gpu": {"requests": {"cpu": "4", "memory": "24Gi"}, "limits": {"cpu": "4", "memory": "24Gi"}},
    "cpu": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}},
}
CPU_APP_GROUP = {"replicas": 1, "minReplicas": 1, "maxReplicas": 2}  # workers.cpu, for HF/analysis
WORKER_SCALING_ANNOTATION = "llm-serving.io/worker-scaling"
GPU_TOLERATIONS = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]

AUTOSCALER: dict[str, Any] = {
    "upscalingMode": "Default",
    "idleTimeoutSeconds": 120,
    "resources": {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"cpu": "500m", "memory": "512Mi"},
    },
}

MODEL_CACHE_PATH = "/models"
MODEL_CACHE_SIZE_LIMIT = "50Gi"
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
HF_TOKEN_MODE = 0o440  # the Secret's files: readable by the ray group only
PREFETCH_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "1", "memory": "4Gi"},
    "limits": {"cpu": "1", "memory": "4Gi"},
}
# Every model reference an app serves is an argument (serving.k8s.served_model_refs).
PREFETCH_SCRIPT = (
    "import sys; from serving.models import resolve_model; "
    "print(*(resolve_model(ref) for ref in sys.argv[1:]))"
)

PROBE_TIMINGS: dict[str, dict[str, int]] = {
    "startup": {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 90},
    "liveness": {"periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 8},
    "readiness": {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
}

POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": False,
    "capabilities": {"drop": ["ALL"]},
}

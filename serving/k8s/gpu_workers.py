"""GPU replicas the Serve apps may run, at most and at the fewest, and what the GPU worker group
needs for them: the operator's checks and the chart's (templates/_validate.tpl gpuReplicas,
templates/_helpers.tpl workerMinReplicas) count the same way."""

from __future__ import annotations

from typing import NamedTuple

from serving.config import PlatformConfig
from serving.config.apps import apps_of
from serving.k8s.serve_config import vllm_deployments


class GpuReplicas(NamedTuple):
    most: int  # max_replicas, or num_replicas of an app Serve does not scale
    fewest: int  # min_replicas (0: it may scale to zero), or num_replicas
    surge_percent: int  # max_surge_percent (0 for an app without one)


def gpu_replicas(config: PlatformConfig) -> list[GpuReplicas]:
    """Every enabled app (each model of `models` on its own) on accelerator gpu."""
    others = [getattr(config, app.name) for app in apps_of(config) if app.name != "vllm"]
    found = []
    for section in [*vllm_deployments(config), *(s for s in others if s.enabled)]:
        if section.resources.accelerator == "gpu":
            surge = getattr(section, "max_surge_percent", 0)
            if scaling := getattr(section, "autoscaling", None):  # None: a fixed num_replicas
                found.append(GpuReplicas(scaling.max_replicas, scaling.min_replicas, surge))
            else:
                fixed = getattr(section, "num_replicas", 1)
                found.append(GpuReplicas(fixed, fixed, surge))
    return found


def gpu_demand(config: PlatformConfig) -> int:
    """GPUs Serve may ask for at most: one per replica of every GPU app."""
    return sum(app.most for app in gpu_replicas(config))


def surge_gpus(config: PlatformConfig) -> int:
    """GPUs a rolling update adds at full scale: the largest ceil(surge% x replicas) of any GPU
    app (Serve's _surge_replicas_to_start; the chart's llm-serving.surgeWarning)."""
    return max((-(-app.surge_percent * app.most // 100) for app in gpu_replicas(config)), default=0)


def gpu_worker_min(config: PlatformConfig) -> int:
    """The GPU worker group's minReplicas when none is given: 0 when every GPU app may scale to
    zero, so KubeRay's autoscaler can remove the last GPU worker, else 1."""
    return 1 if any(app.fewest for app in gpu_replicas(config)) else 0

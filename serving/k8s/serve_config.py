"""What the cluster runs, derived from PlatformConfig with pure functions (no cluster, no Helm).

`serve_config_v2` is the RayService's serveConfigV2 (Ray Serve's ServeDeploySchema): the chart
renders the same document from `.Values.platform`, and a test holds the two equal.
"""

from __future__ import annotations

from typing import Any

from serving.config import ROUTER_CONFIGS, PlatformConfig, VLLMReplicaSettings
from serving.config import apps as registry
from serving.config.ray_env import drain_deadline_s

SERVE_HOST = "0.0.0.0"  # in a pod the proxy must listen beyond loopback, whatever http.host says
# Only the chart's CPU worker group advertises this resource (one per pod); in a cluster every
# replica on the CPU requires a sliver of it. GPU workers advertise just the CPUs their vLLM
# replicas reserve: a CPU replica placed there first would leave that GPU idle.
CPU_WORKER_RESOURCE = "llm-serving.io/cpu-worker"
CPU_WORKER_SHARE = 0.001

# Fields kept out of `args`: Serve applies the deployment options to running replicas in place
# (serve config `deployments`), and the app's own entry carries `enabled` and `route_prefix`.
NOT_IN_ARGS = (
    "enabled",
    "route_prefix",
    "num_replicas",
    "autoscaling",
    "max_ongoing_requests",
    "backpressure",
    "graceful_shutdown_timeout_s",
    "graceful_shutdown_wait_loop_s",
    "max_surge_percent",
)


def app_args(config: PlatformConfig, name: str) -> dict[str, Any]:
    """The part of the platform block (as the user wrote it: only set fields) one app reads,
    without the deployment options Serve applies in place."""
    written = config.model_dump(mode="json", exclude_unset=True)
    args = {
        key: written[key] for key in registry.app_named(config, name).sections if key in written
    }
    if name in args:
        args[name] = {k: v for k, v in args[name].items() if k not in NOT_IN_ARGS}
        if not args[name]:
            del args[name]
    return args


def deployment_options(config: PlatformConfig, name: str) -> dict[str, Any]:
    """Serve's per-deployment options of one app (ServeApplicationSchema `deployments` entry)."""
    settings = getattr(config, name)
    app = registry.app_named(config, name)
    options: dict[str, Any] = {"name": app.deployment}
    if not app.scaled:
        return options | {"max_ongoing_requests": settings.max_ongoing_requests}
    serve_options = settings.replica_options(drain_deadline_s(config))
    backpressure = serve_options.pop("backpressure_config")
    serve_options["backpressure_config"] = {
        "status_code": backpressure.status_code,
        "retry_after_s": backpressure.retry_after_s,
    }
    return options | serve_options


def router_option(policy: str) -> dict[str, Any]:
    """The deployment's Serve request router (serving.routing)."""
    return {"request_router_config": ROUTER_CONFIGS[policy]}


def pinned_to_cpu_workers(config: PlatformConfig, name: str) -> PlatformConfig:
    """The config with app `name`'s replicas requiring the CPU worker group's resource when they
    run on the CPU (in a cluster); apps on a GPU are left as they are."""
    settings = getattr(config, name)
    resources = getattr(settings, "resources", None)  # an app may leave placement to Serve
    if resources is None or resources.accelerator != "cpu":
        return config
    custom = resources.custom_resources | {CPU_WORKER_RESOURCE: CPU_WORKER_SHARE}
    pinned = resources.model_copy(update={"custom_resources": custom})
    return config.model_copy(update={name: settings.model_copy(update={"resources": pinned})})


def serve_applications(config: PlatformConfig, cluster: bool = False) -> list[dict[str, Any]]:
    apps = []
    for app in registry.apps_of(config):
        name = app.name
        settings = getattr(config, name)
        if not settings.enabled:
            continue
        if name == "vllm" and config.models:
            apps += model_applications(config, cluster)
            continue
        platform = pinned_to_cpu_workers(config, name) if cluster else config
        apps.append(
            {
                "name": name,
                "import_path": app.builder,
                "route_prefix": settings.route_prefix,
                "args": app_args(platform, name),
                "deployments": [deployment_options(config, name)],
            }
        )
    return apps


# What the router reads of each model (serving/deployments/model_router.py). Its args carry no
# more, so a change of a model's replicas, engine or resources leaves the router's replicas, and
# the streams they forward, alone (Serve rolls an app whose args change).
ROUTER_MODEL_KEYS = (
    "name",
    "adapters",
    "runtime_adapters",
    "adapter_roots",
    "adapter_hub_ids",
    "backpressure",
)


def model_applications(config: PlatformConfig, cluster: bool = False) -> list[dict[str, Any]]:
    """A multi-model platform's OpenAI endpoint: the router app at vllm.route_prefix, and one
    app per model without a route of its own (the router reaches it by handle), so a change to
    one model restarts that model alone. In a cluster the router (CPU only; Serve's default of
    one CPU, which its code keeps) requires the CPU worker group's resource."""
    written = config.model_dump(mode="json", exclude_unset=True)
    router: dict[str, Any] = {
        "name": "vllm",
        "import_path": registry.ROUTER_BUILDER,
        "route_prefix": config.vllm.route_prefix,
        "args": {
            "models": [{k: m[k] for k in ROUTER_MODEL_KEYS if k in m} for m in written["models"]],
            **{
                key: written[key]
                for key in ("auth", "limits", "state", "tracing")
                if key in written
            },
        },
    }
    if cluster:
        # Serve replaces the code's actor options with these; the router's code sets none.
        actor = {"num_cpus": 1, "resources": {CPU_WORKER_RESOURCE: CPU_WORKER_SHARE}}
        router["deployments"] = [{"name": registry.ROUTER_DEPLOYMENT, "ray_actor_options": actor}]
    models = []
    for entry in config.models:
        platform = config.model_platform(entry)
        if cluster:
            platform = pinned_to_cpu_workers(platform, "vllm")
        models.append(
            {
                "name": entry.app_name,
                "import_path": registry.MODEL_BUILDER,
                "route_prefix": None,
                "args": app_args(platform, "vllm"),
                "deployments": [
                    deployment_options(platform, "vllm") | router_option(entry.routing)
                ],
            }
        )
    return [router, *models]


def vllm_deployments(config: PlatformConfig) -> list[VLLMReplicaSettings]:
    """The vLLM deployments the platform runs: one per model with `models`, else `vllm`."""
    if not config.vllm.enabled:
        return []
    return list(config.models) if config.models else [config.vllm]


def served_model_refs(config: PlatformConfig) -> list[str]:
    """Every model reference an enabled app serves, once each, in order (what a worker's init
    container prefetches): each model of `models`, and the top-level model unless only the
    `models` endpoint runs (every other app serves it)."""
    by_models = bool(config.models and config.vllm.enabled)
    refs = [entry.model.ref for entry in config.models] if by_models else []
    others = (
        getattr(config, app.name).enabled for app in registry.apps_of(config) if app.name != "vllm"
    )
    if not by_models or any(others):
        refs.insert(0, config.model.ref)
    return list(dict.fromkeys(refs))


def gpu_replica_cpus(config: PlatformConfig) -> float:
    """Logical CPUs one vLLM replica on a GPU worker reserves: the largest of the deployments
    on GPUs (of all vLLM deployments when none is), so any of them fits beside its GPU."""
    deployments = vllm_deployments(config) or [config.vllm]
    on_gpu = [d for d in deployments if d.resources.accelerator == "gpu"] or deployments
    return max(d.resources.num_cpus for d in on_gpu)


def serve_config(config: PlatformConfig, host: str, cluster: bool = False) -> dict[str, Any]:
    """Serve's config document of the platform (ServeDeploySchema), checked against Ray Serve's
    own schema. The RayService carries it; `llm-serving up`/`apply` PUT it to the local head's
    dashboard, so both deploy each app from the same `args` and deployment options. `cluster`:
    replicas on the CPU require the CPU worker group's resource (one local node has none)."""
    document = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": config.http.port},
        "applications": serve_applications(config, cluster),
    }
    validate_serve_config(document)
    return document


class InlineKeysError(ValueError):
    """API keys written in the platform config, which a cluster refuses."""


def inline_key_settings(config: PlatformConfig) -> list[str]:
    """The settings holding API keys written in the config. A cluster refuses them (the chart's
    validation says the same): they would travel in the serve config's `args`, which anyone
    reaching the Ray dashboard reads (`GET /api/serve/applications/`). A tenant's keys too."""
    sections = {"auth": config.auth, "analysis.auth": config.analysis.auth}
    found: list[str] = []
    for path, auth in sections.items():
        if auth is None:
            continue
        found += [f"{path}.api_keys"] if auth.api_keys else []
        found += [f"{path}.tenants[{i}].api_keys" for i, t in enumerate(auth.tenants) if t.api_keys]
    return found


def serve_config_v2(config: PlatformConfig) -> dict[str, Any]:
    """serveConfigV2 of the RayService: the proxy listens beyond loopback in a pod, and no API
    key is in it (InlineKeysError names a setting that holds one)."""
    if settings := inline_key_settings(config):
        raise InlineKeysError(
            f"{', '.join(settings)}: API keys written in the config would travel in the "
            "RayService's serve config, readable on the Ray dashboard; put them in a Secret "
            "(the chart's apiKeys.existingSecret or tenantKeys, the LLMService's apiKeySecret or "
            "tenantKeySecrets) instead"
        )
    return serve_config(config, SERVE_HOST, cluster=True)


def validate_serve_config(document: dict[str, Any]) -> None:
    """Raise pydantic's ValidationError when Ray Serve would reject the document."""
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(document)

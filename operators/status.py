"""RayService status + the platform's metrics -> LLMService status. Pure functions; the metrics
text comes from an injected fetch, so tests feed it any exposition they like."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from operators.render import api_service_name
from operators.spec import (
    Condition,
    ConditionType,
    LLMServiceSpec,
    LLMServiceStatus,
    ModelStatus,
)
from serving.config import PlatformConfig
from serving.metrics import QUEUE_DEPTH

VLLM_APP = "vllm"
# Ray exports application metrics with a `ray_` prefix. The Serve controller (on the head node)
# publishes cluster-wide numbers: the autoscaler's input (requests queued + running across every
# replica) and each replica's health, so one scrape of the head answers for the whole service.
SERVE_TOTAL_REQUESTS = "ray_serve_autoscaling_total_requests"
SERVE_REPLICA_HEALTHY = "ray_serve_deployment_replica_healthy"
# The autoscaler's decision, recorded at every control loop (unlike the replica gauge, which Ray
# refreshes every 10 s and its agent drops between): 0 only for a deployment that may go to zero.
SERVE_DESIRED_REPLICAS = "ray_serve_autoscaling_desired_replicas"
ENGINE_QUEUE_DEPTH = f"ray_{QUEUE_DEPTH}"  # the engine's own waiting queue, per replica
# Where the operator scrapes: KubeRay names the head's Service `<rayservice>-head-svc`; it
# carries the head container's ports, Ray's metrics port among them.
METRICS_URL_ENV = "LLM_SERVING_OPERATOR_METRICS_URL"
DEFAULT_METRICS_URL = "http://{name}-head-svc.{namespace}.svc.cluster.local:{port}/metrics"
FAILED_APP_STATES = {"DEPLOY_FAILED", "UNHEALTHY"}
RUNNING = "RUNNING"  # Serve's application status once every deployment is healthy
METRICS_PORT = 8080  # Ray's metrics export port on every Ray pod (the chart's "metrics" port)

Fetch = Callable[[str], str]


@dataclass(frozen=True)
class PlatformLoad:
    queue_depth: float | None
    replicas: int | None
    cold_apps: tuple[str, ...] | None = None  # vLLM apps at zero replicas; None: not measured


def endpoint_url(name: str, namespace: str, config: PlatformConfig) -> str:
    """In-cluster base URL of the OpenAI routes, through the RayService's API Service."""
    prefix = config.vllm.route_prefix.rstrip("/")
    host = f"{api_service_name(name)}.{namespace}.svc.cluster.local"
    return f"http://{host}:{config.http.port}{prefix}/v1"


def metrics_url(name: str, namespace: str) -> str:
    template = os.environ.get(METRICS_URL_ENV) or DEFAULT_METRICS_URL
    return template.format(name=name, namespace=namespace, port=METRICS_PORT)


def vllm_apps(config: PlatformConfig) -> tuple[str, ...]:
    """The Serve applications whose replicas run vLLM: each model's with `models` (the `vllm`
    app is then the router, whose replicas run no engine), else `vllm`."""
    return tuple(entry.app_name for entry in config.models) or (VLLM_APP,)


def _sums(text: str, apps: tuple[str, ...]) -> dict[str, float]:
    """Per metric name, the sum over the samples of vLLM replicas: Serve's gauges name their
    application, the engines' own gauges only their engine (`vllm` for every model)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            ours = (
                labels["application"] in apps
                if "application" in labels
                else labels.get("engine") == VLLM_APP
            )
            if ours:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def load_from_metrics(text: str, apps: tuple[str, ...] = (VLLM_APP,)) -> PlatformLoad:
    """Queue depth and healthy replicas of the vLLM applications from Prometheus text. The queue
    prefers Serve's autoscaler view (set when autoscaling is on) over the engines' waiting queue."""
    sums = _sums(text, apps)
    queue = sums.get(SERVE_TOTAL_REQUESTS, sums.get(ENGINE_QUEUE_DEPTH))
    replicas = sums.get(SERVE_REPLICA_HEALTHY)
    return PlatformLoad(queue, None if replicas is None else int(replicas), cold_apps(text, apps))


def cold_apps(text: str, apps: tuple[str, ...]) -> tuple[str, ...]:
    """The vLLM apps at zero: the autoscaler wants 0 replicas and no healthy one is reported."""
    desired: dict[str, float] = {}
    healthy: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            app = sample.labels.get("application")
            if app not in apps:
                continue
            if sample.name == SERVE_DESIRED_REPLICAS:
                desired[app] = desired.get(app, 0.0) + sample.value
            elif sample.name == SERVE_REPLICA_HEALTHY:
                healthy[app] = healthy.get(app, 0.0) + sample.value
    return tuple(app for app in apps if desired.get(app) == 0 and not healthy.get(app))


def model_of_app(config: PlatformConfig, app: str) -> str:
    """The model name clients pass for a vLLM app (`vllm`, or `vllm-NAME` of `models`)."""
    names = {entry.app_name: entry.name for entry in config.models}
    return names.get(app, config.model.name)


def live_replicas(text: str, apps: tuple[str, ...]) -> dict[str, int]:
    """Healthy replicas of each vLLM application now (Serve's gauge, one sample per replica)."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            app = sample.labels.get("application")
            if sample.name == SERVE_REPLICA_HEALTHY and app in apps:
                counts[app] = counts.get(app, 0) + int(sample.value)
    return counts


def read_live_replicas(url: str, fetch: Fetch, apps: tuple[str, ...]) -> dict[str, int]:
    """Empty when the endpoint cannot be read (a first create, a head down): nothing is known."""
    try:
        return live_replicas(fetch(url), apps)
    except Exception:  # noqa: BLE001 - any network or parse failure means "unknown", not a crash
        return {}


def read_load(url: str, fetch: Fetch, apps: tuple[str, ...] = (VLLM_APP,)) -> PlatformLoad | None:
    """None when the endpoint cannot be read: the status keeps saying so instead of failing."""
    try:
        return load_from_metrics(fetch(url), apps)
    except Exception:  # noqa: BLE001 - any network or parse failure means "unknown", not a crash
        return None


@dataclass(frozen=True)
class RayServiceHealth:
    ready: bool
    failed: bool
    upgrading: bool
    reason: str
    message: str


def _condition(rs_status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in rs_status.get("conditions") or [] if c.get("type") == kind), None)


def _app_statuses(rs_status: dict[str, Any]) -> dict[str, Any]:
    """Serve's application statuses on the cluster that serves traffic, by app name."""
    return (rs_status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}


def _failed_apps(rs_status: dict[str, Any]) -> list[str]:
    apps = _app_statuses(rs_status)
    return [
        f"{name}: {app.get('status')}" + (f" ({app['message']})" if app.get("message") else "")
        for name, app in sorted(apps.items())
        if app.get("status") in FAILED_APP_STATES
    ]


def rayservice_health(rayservice: dict[str, Any] | None) -> RayServiceHealth:
    """Reads KubeRay's own verdict: the `Ready` condition (KubeRay >= 1.3) or `serviceStatus`
    (older), plus per-application Serve statuses for failures."""
    if rayservice is None:
        return RayServiceHealth(
            False, False, False, "RayServiceMissing", "the RayService does not exist"
        )
    status = rayservice.get("status") or {}
    failed = _failed_apps(status)
    if failed:
        return RayServiceHealth(False, True, False, "ApplicationFailed", "; ".join(failed))
    ready_cond = _condition(status, "Ready")
    ready = (ready_cond or {}).get("status") == "True" or status.get("serviceStatus") == "Running"
    upgrade = _condition(status, "UpgradeInProgress")
    upgrading = (upgrade or {}).get("status") == "True" or bool(status.get("pendingServiceStatus"))
    reason = (ready_cond or {}).get("reason") or ("Running" if ready else "RayServiceNotReady")
    message = (ready_cond or {}).get("message") or (
        "the RayService serves traffic" if ready else "waiting for the RayService to become ready"
    )
    return RayServiceHealth(ready, False, upgrading, reason, message)


def model_statuses(config: PlatformConfig, rayservice: dict[str, Any] | None) -> list[ModelStatus]:
    """Each model of `models` with its Serve application's status (none reported yet: unset and
    not ready); [] for a single-model platform."""
    apps = _app_statuses((rayservice or {}).get("status") or {})
    found = []
    for entry in config.models:
        app = apps.get(entry.app_name) or {}
        state = app.get("status")
        found.append(
            ModelStatus(
                name=entry.name,
                app=entry.app_name,
                status=state,
                ready=state == RUNNING,
                message=app.get("message") or None,
            )
        )
    return found


def cold_model_names(config: PlatformConfig, load: PlatformLoad | None) -> list[str] | None:
    """Names of the models at zero replicas (their next request waits for a cold start)."""
    if load is None or load.cold_apps is None:
        return None
    return [model_of_app(config, app) for app in load.cold_apps]


def _cond(
    kind: ConditionType, on: bool, reason: str, message: str, now: str, generation: int | None
) -> Condition:
    return Condition(
        type=kind,
        status="True" if on else "False",
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )


def merge_conditions(old: list[dict[str, Any]], new: list[Condition]) -> list[dict[str, Any]]:
    """Keep a condition's lastTransitionTime while its status does not change."""
    previous = {c.get("type"): c for c in old or []}
    merged = []
    for cond in new:
        data = cond.model_dump(by_alias=True, exclude_none=True)
        before = previous.get(cond.type)
        if before and before.get("status") == cond.status and before.get("lastTransitionTime"):
            data["lastTransitionTime"] = before["lastTransitionTime"]
        merged.append(data)
    return merged


def observed_status(
    name: str,
    namespace: str,
    spec: LLMServiceSpec,
    rayservice: dict[str, Any] | None,
    load: PlatformLoad | None,
    generation: int | None,
    old_conditions: list[dict[str, Any]],
    now: str,
) -> dict[str, Any]:
    """The status of a valid LLMService from what the cluster and the metrics say now; `load`
    None means not measured (the replica and queue fields are then left out of the patch)."""
    health = rayservice_health(rayservice)
    progressing = not health.failed and (not health.ready or health.upgrading)
    conditions = [
        _cond("Ready", health.ready, health.reason, health.message, now, generation),
        _cond(
            "Progressing",
            progressing,
            "Upgrading" if health.upgrading else ("Deploying" if progressing else "Deployed"),
            "a new RayCluster is being prepared" if health.upgrading else health.message,
            now,
            generation,
        ),
        _cond(
            "Degraded",
            health.failed,
            health.reason if health.failed else "AsExpected",
            health.message if health.failed else "",
            now,
            generation,
        ),
    ]
    models = model_statuses(spec.platform, rayservice)
    ready_models = sum(model.ready for model in models)
    status = LLMServiceStatus(
        conditions=[],
        model=",".join(m.name for m in spec.platform.models) or spec.platform.model.name,
        models=models or None,
        models_ready=f"{ready_models}/{len(models)}" if models else None,
        observed_replicas=load.replicas if load else None,
        cold_models=cold_model_names(spec.platform, load),
        queue_depth=load.queue_depth if load else None,
        endpoint=endpoint_url(name, namespace, spec.platform),
        ray_service=name,
        observed_generation=generation,
    ).model_dump(by_alias=True)  # None stays: in a merge patch it clears a stale value
    del status["replicasObservedAt"]  # keep_last_replicas sets it
    if models:  # each entry without unset fields: the list is replaced whole by a merge patch
        status["models"] = [m.model_dump(by_alias=True, exclude_none=True) for m in models]
    if load is None:  # not measured this time (a spec change): leave the last numbers alone
        del status["observedReplicas"], status["queueDepth"], status["coldModels"]
    status["conditions"] = merge_conditions(old_conditions, conditions)
    return status


def keep_last_replicas(new: dict[str, Any], old: dict[str, Any], now: str) -> dict[str, Any]:
    """Ray exports the replica gauge in about one scrape in five (refreshed every 10 s, dropped
    after two 2 s reports): a scrape without it keeps the last count and when it was measured,
    instead of clearing the field (and writing the status) on every flip."""
    if "observedReplicas" not in new:  # not measured at all this time (a spec change)
        return new
    if new["observedReplicas"] is not None:  # the time moves when the count does: few writes
        same = new["observedReplicas"] == old.get("observedReplicas")
        return {**new, "replicasObservedAt": old.get("replicasObservedAt") if same else now}
    if old.get("observedReplicas") is None:
        return new
    return {
        **new,
        "observedReplicas": old["observedReplicas"],
        "replicasObservedAt": old.get("replicasObservedAt"),
    }


def rejected_status(
    reason: str,
    message: str,
    generation: int | None,
    old_conditions: list[dict[str, Any]],
    now: str,
) -> dict[str, Any]:
    """A spec the operator cannot act on (invalid, or its RayService name is taken): Degraded with
    the reason; nothing is deployed or changed for it, a RayService already running stays."""
    conditions = [
        _cond("Ready", False, reason, "not deployed; see the Degraded condition", now, generation),
        _cond(
            "Progressing", False, reason, "waiting for the resource to be fixed", now, generation
        ),
        _cond("Degraded", True, reason, message, now, generation),
    ]
    return {
        "conditions": merge_conditions(old_conditions, conditions),
        "observedGeneration": generation,
    }

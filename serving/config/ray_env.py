"""What a PlatformConfig puts into the environment of every Ray process (the local head, the
chart's and the operator's pods), and the drain deadline: the longest an accepted request may
still need, which bounds every wait that could cut one (HAProxy's hard stop after a reload,
KubeRay's deletion of the old cluster, a worker pod's drain)."""

from __future__ import annotations

import math

from serving.config.apps import apps_of
from serving.config.platform import PlatformConfig
from serving.config.replica import AutoscalingSettings

# Environment of every Ray process whatever the config (the chart reads it from its generated
# tables): metrics reach Prometheus every 2 s instead of Ray's 10 s, and a replica killed by
# SIGKILL (OOM killer, crash), which cannot stop vLLM's engine-core child itself, has it killed by
# the raylet (made subreaper), which frees its memory. Serve's proxy answers its own refusals (a
# full queue, e.g. at zero replicas) in the OpenAI error shape (serving.api.proxy_errors).
RAY_STATIC_ENV = {
    "RAY_metrics_report_interval_ms": "2000",
    "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serving.api.proxy_errors:middlewares",
}
# The request deadline starts when a replica takes the request; before that it may wait in
# Serve's queue and its body may still be arriving, and after it the replica aborts the engine
# work and sends the error event. 30 s covers both ends (a full queue drains in seconds).
DRAIN_MARGIN_S = 30
# With no request limit (limits.request_timeout_s unset) a request may run for ever; an hour is
# what the platform still waits for.
UNLIMITED_REQUEST_S = 3600


def drain_deadline_s(config: PlatformConfig) -> int:
    """Seconds an accepted request may still need: limits.request_timeout_s (rounded up, an
    hour when unset) + DRAIN_MARGIN_S. The chart's `llm-serving.drainDeadlineSeconds` computes
    the same number from its values."""
    timeout_s = config.limits.request_timeout_s
    request_s = UNLIMITED_REQUEST_S if timeout_s is None else math.ceil(timeout_s)
    return request_s + DRAIN_MARGIN_S


def haproxy_hard_stop_s(config: PlatformConfig) -> int:
    """How long an old HAProxy keeps its connections after a reload: http.haproxy_hard_stop_s,
    else the drain deadline."""
    return config.http.haproxy_hard_stop_s or drain_deadline_s(config)


def ray_env(config: PlatformConfig) -> dict[str, str]:
    """Environment of every Ray process (local head, chart pods): the ingress, how long its
    replicas drain and how long an old HAProxy keeps open connections after a reload, how fast
    queues are reported (the fastest autoscaled deployment's interval, each model's included).
    Serve will read its push intervals from these variables (Ray 2.60 still takes each
    deployment's `metrics_interval_s`, which `AutoscalingSettings.serve_options` sets too)."""
    deployments = [getattr(config, app.name) for app in apps_of(config) if app.scaled]
    deployments += config.models
    intervals = [d.autoscaling.metrics_interval_s for d in deployments if d.autoscaling]
    # Apps deployed later (or by hand) get the default: cheap, and the autoscaler reacts fast.
    # `g` writes the float as Helm's toString does (1 -> "1"), so the chart computes the same.
    push_s = format(min(intervals, default=AutoscalingSettings().metrics_interval_s), "g")
    ingress = {}
    if config.http.ingress == "haproxy":
        ingress = {
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": format(
                config.http.replica_drain_s, "g"
            ),
            "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S": str(haproxy_hard_stop_s(config)),
        }
    return {
        **ingress,
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": push_s,
        "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": push_s,
        **RAY_STATIC_ENV,
    }

"""The Ray side of PlatformConfig: Serve's HTTP ingress (`http`) and the local Ray head (`ray`).
What these settings put into every Ray process's environment is serving.config.ray_env's job."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from serving.config.replica import StrictModel


class HTTPConfig(StrictModel):
    host: str = Field("127.0.0.1", description="Address the Serve HTTP proxy binds.")
    port: int = Field(8000, gt=0, lt=65536, description="Port of the Serve HTTP proxy.")
    ingress: Literal["haproxy", "proxy"] = Field(
        "haproxy",
        description="haproxy: Ray's HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY) sends HTTP "
        "straight to the replicas' own HTTP servers, which then bind every interface (vLLM's "
        "app at plain vLLM's speed). proxy: Serve's Python HTTP proxy forwards each request and "
        "each streamed chunk to a replica through Ray.",
    )
    replica_drain_s: float = Field(
        30.0,
        ge=0,
        description="haproxy: how long a stopping replica still takes new connections, so that "
        "every HAProxy drops it before it closes (RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S, "
        "Ray's 30 s); its open requests then finish within graceful_shutdown_timeout_s. Also how "
        "long deleting an app or `down` waits. One machine's HAProxy follows within a second.",
    )
    haproxy_hard_stop_s: int | None = Field(
        None,
        gt=0,
        description="haproxy: every replica change anywhere reloads every HAProxy, and the old "
        "process, which still carries the open connections, is killed this many seconds later "
        "(RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S). Unset: the drain deadline, limits."
        "request_timeout_s + 30 s (3600 + 30 s without a request limit), so no accepted request "
        "is cut; 120 is Ray's default, which cuts any stream longer than 2 minutes at a reload. "
        "Ray keeps a released replica port unused for this + 30 s (RAY_SERVE_PORT_QUARANTINE_S).",
    )


class RayConfig(StrictModel):
    num_cpus: int = Field(
        8, gt=0, description="Logical CPUs of the local Ray head; enough for every replica."
    )
    dashboard_host: str = Field("127.0.0.1", description="Address the Ray dashboard binds.")
    dashboard_port: int = Field(8265, gt=0, lt=65536, description="Port of the Ray dashboard.")
    metrics_export_port: int = Field(
        8080, gt=0, lt=65536, description="Port of the node's Prometheus endpoint (Ray metrics)."
    )

"""The drain deadline (serving.config.ray_env.drain_deadline_s): the chart computes the same number from
its values as Python does from the platform, HAProxy's hard stop after a reload follows it (or
http.haproxy_hard_stop_s) on every Ray container, and KubeRay keeps an old cluster that long."""

from __future__ import annotations

from typing import Any

import pytest

from serving.config import PlatformConfig
from serving.config.ray_env import drain_deadline_s, ray_env
from serving.k8s import chart as k8s_render
from tests.k8s.conftest import Rendered, ray_containers

HARD_STOP = "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S"


def rayservice_of(values: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")


def platform_of(values: dict[str, Any]) -> PlatformConfig:
    return PlatformConfig.model_validate(k8s_render.merged_values(values)["platform"])


def hard_stops(rayservice: dict[str, Any]) -> set[str | None]:
    """The hard stop of every Ray container (one value when they agree)."""
    envs = [{e["name"]: e.get("value") for e in c["env"]} for c in ray_containers(rayservice)]
    return {env.get(HARD_STOP) for env in envs}


def test_every_case_keeps_its_old_cluster_for_the_drain_deadline(case: Rendered) -> None:
    spec = case.one("RayService")["spec"]
    assert spec["rayClusterDeletionDelaySeconds"] == drain_deadline_s(case.platform)


@pytest.mark.parametrize(
    ("platform", "deadline", "hard_stop"),
    [
        ({}, 630, "630"),  # the 600 s request limit + the 30 s margin
        ({"limits": {"request_timeout_s": 90}}, 120, "120"),
        ({"limits": {"request_timeout_s": 12.5}}, 43, "43"),  # rounded up
        ({"limits": {"request_timeout_s": None}}, 3630, "3630"),  # no limit: an hour
        ({"http": {"haproxy_hard_stop_s": 120}}, 630, "120"),  # Ray's default, set by hand
        ({"http": {"ingress": "proxy"}}, 630, None),  # no HAProxy, nothing to hard-stop
        (
            {"limits": {"request_timeout_s": 30}, "http": {"haproxy_hard_stop_s": 900}},
            60,
            "900",
        ),
    ],
)
def test_chart_and_ray_env_agree_on_the_deadline(
    platform: dict[str, Any], deadline: int, hard_stop: str | None
) -> None:
    values = {"platform": platform}
    rayservice = rayservice_of(values)
    config = platform_of(values)
    assert drain_deadline_s(config) == deadline
    assert rayservice["spec"]["rayClusterDeletionDelaySeconds"] == deadline
    assert ray_env(config).get(HARD_STOP) == hard_stop
    assert hard_stops(rayservice) == {hard_stop}

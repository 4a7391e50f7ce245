"""operators.render through the chart: an LLMService's request limit sets its drain deadline, so
its HAProxies keep a reloaded process's streams as long as a request may run and KubeRay keeps
the old RayCluster that long after a switch (serving.config.ray_env.drain_deadline_s)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from operators.render import render_rayservice
from serving.config import PlatformConfig
from serving.config.ray_env import drain_deadline_s, ray_env
from tests.k8s.conftest import ray_containers, repo_path
from tests.k8s.schemas import crd_errors, crds_available

EXAMPLE = yaml.safe_load(repo_path("k8s", "examples", "llmservice.yaml").read_text())["spec"]
HARD_STOP = "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S"
Doc = dict[str, Any]


def spec_with(**platform: Any) -> Doc:
    spec = copy.deepcopy(EXAMPLE)
    spec["platform"] |= platform
    return spec


def hard_stops(rayservice: Doc) -> set[str | None]:
    """The hard stop of every Ray container (one value when they agree)."""
    envs = [{e["name"]: e.get("value") for e in c["env"]} for c in ray_containers(rayservice)]
    return {env.get(HARD_STOP) for env in envs}


@pytest.mark.parametrize(
    ("platform", "deadline", "hard_stop"),
    [
        ({}, 630, "630"),  # the default 600 s request limit + 30 s
        ({"limits": {"request_timeout_s": 1800}}, 1830, "1830"),  # a long-generation service
        ({"limits": {"request_timeout_s": 45.5}}, 76, "76"),
        (
            {"limits": {"request_timeout_s": 1800}, "http": {"haproxy_hard_stop_s": 120}},
            1830,
            "120",
        ),
    ],
)
def test_the_request_limit_sets_the_hard_stop_and_the_deletion_delay(
    platform: Doc, deadline: int, hard_stop: str
) -> None:
    spec = spec_with(**platform)
    rayservice = render_rayservice("qwen", "ns", spec)
    assert rayservice["spec"]["rayClusterDeletionDelaySeconds"] == deadline
    assert hard_stops(rayservice) == {hard_stop}
    config = PlatformConfig.model_validate(spec["platform"])
    assert drain_deadline_s(config) == deadline and ray_env(config)[HARD_STOP] == hard_stop


@pytest.mark.skipif(not crds_available(), reason="KubeRay CRD schemas not in ../shared")
def test_the_deletion_delay_is_a_field_kuberay_accepts() -> None:
    rayservice = render_rayservice("qwen", "ns", spec_with(limits={"request_timeout_s": 1800}))
    assert crd_errors(rayservice) == []

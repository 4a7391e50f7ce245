"""Runtime LoRA loading is refused unless it is safe to offer: API keys on, adapter paths only
under configured roots (after resolving links) or configured hub ids, only through the model
router (never vLLM's own unchecked routes on a replica). A config that relied on the old
behaviour fails at start, naming the setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serving.api.auth import KeyRing, check_runtime_adapter_keys
from serving.config import ConfigError, parse_config
from serving.config.adapters import AdapterPathRefused, allowed_adapter_path
from serving.deployments.vllm_server import build_vllm_app
from serving.engines.vllm import vllm_env


def runtime_models(auth: dict | None = None, **tiny: object) -> dict:
    config: dict = {
        "models": [
            {"name": "base", "model": {"ref": "default"}},
            {"name": "tiny", "model": {"ref": "tiny-qwen2"}, "runtime_adapters": True, **tiny},
        ]
    }
    return config | ({"auth": auth} if auth is not None else {})


def test_runtime_adapters_without_roots_or_hub_ids_fail_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"models\.1: .*runtime_adapters needs adapter_roots"):
        parse_config(runtime_models())
    assert parse_config(runtime_models(adapter_roots=["/srv/adapters"])).models[1].adapter_roots
    assert parse_config(runtime_models(adapter_hub_ids=["org/lora"])).models[1].runtime_adapters


def test_runtime_adapters_with_no_place_for_keys_fail_naming_auth() -> None:
    no_keys = {"api_keys": [], "api_keys_env": None}
    with pytest.raises(
        ConfigError, match=r"models\[1\]\.runtime_adapters needs API keys: set auth\.api_keys"
    ):
        parse_config(runtime_models(no_keys, adapter_roots=["/srv"]))
    parse_config(runtime_models({"api_keys": ["k"], "api_keys_env": None}, adapter_roots=["/s"]))


def test_the_router_refuses_to_start_runtime_adapters_without_keys() -> None:
    """The environment's keys are read where they are used: at the router's start."""
    config = parse_config(runtime_models(adapter_roots=["/srv"]))
    with pytest.raises(ConfigError, match=r"models\[1\]\.runtime_adapters needs API keys"):
        check_runtime_adapter_keys(config, KeyRing.of([]))
    check_runtime_adapter_keys(config, KeyRing.of(["key"]))


def test_a_single_model_platform_refuses_runtime_adapters_naming_the_setting() -> None:
    """vLLM's own load routes would load any path on one replica: only the router offers them."""
    config = parse_config({"vllm": {"runtime_adapters": True, "adapter_roots": ["/srv"]}})
    with pytest.raises(ConfigError, match=r"vllm\.runtime_adapters: .* `models`"):
        build_vllm_app(config)


def test_no_replica_registers_vllms_unchecked_adapter_routes() -> None:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING registers /v1/load_lora_adapter and SageMaker's
    /adapters on a replica's app: loads that bypass the router's checks."""
    config = parse_config(runtime_models(adapter_roots=["/srv"]))
    for entry in config.models:
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm_env(config.model_platform(entry))


def test_a_path_under_a_root_is_loaded_by_its_real_path(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    (root / "mine").mkdir(parents=True)
    (tmp_path / "mine-link").symlink_to(root / "mine")
    assert allowed_adapter_path(str(root / "mine"), [str(root)], []) == str(root / "mine")
    # a link from elsewhere into a root is its target, which lies under the root
    assert allowed_adapter_path(str(tmp_path / "mine-link"), [str(root)], []) == str(root / "mine")


@pytest.mark.parametrize("escape", ["outside", "link-out", "dotdot", "prefix", "hub"])
def test_a_path_outside_the_roots_is_refused_naming_the_settings(
    tmp_path: Path, escape: str
) -> None:
    root = tmp_path / "adapters"
    root.mkdir()
    (tmp_path / "secret").mkdir()
    (root / "link-out").symlink_to(tmp_path / "secret")
    (tmp_path / "adapters-other").mkdir()
    path = {
        "outside": str(tmp_path / "secret"),
        "link-out": str(root / "link-out"),
        "dotdot": f"{root}/../secret",
        "prefix": str(tmp_path / "adapters-other"),  # shares the root's name as a prefix
        "hub": "someone/else",
    }[escape]
    with pytest.raises(AdapterPathRefused, match=r"adapter_roots .* adapter_hub_ids"):
        allowed_adapter_path(path, [str(root)], ["org/lora"])


def test_only_configured_hub_ids_and_never_a_local_path_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert allowed_adapter_path("org/lora", [], ["org/lora"]) == "org/lora"
    monkeypatch.chdir(tmp_path)
    os.makedirs("org/lora")  # vLLM would load this local directory instead of the hub's
    with pytest.raises(AdapterPathRefused):
        allowed_adapter_path("org/lora", [], ["org/lora"])

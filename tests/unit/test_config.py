"""PlatformConfig: the shipped default loads; unknown keys and bad values fail with the field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.config import ConfigError, PlatformConfig, load_config, parse_config
from serving.config.replica import AutoscalingSettings, StrictModel


def test_default_config_ships_and_validates() -> None:
    config = load_config()
    assert config.model.ref == "default"
    assert config.vllm.route_prefix == "/"
    assert config.vllm.resources.accelerator == "cpu"


def test_every_field_has_a_description() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(name)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, StrictModel):
                missing += [f"{name}.{m}" for m in walk(annotation)]
        return missing

    assert walk(PlatformConfig) == []


def test_unknown_key_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"vllm\.engine\.bogus: Extra inputs are not permitted"):
        parse_config({"vllm": {"engine": {"bogus": 1}}})


def test_bad_value_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"vllm\.num_replicas: Input should be greater"):
        parse_config({"vllm": {"num_replicas": 0}})
    with pytest.raises(ConfigError, match=r"vllm\.resources\.accelerator"):
        parse_config({"vllm": {"resources": {"accelerator": "tpu"}}})


def test_yaml_file_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)
    path.write_text("model: {ref: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_route_prefixes_must_be_distinct_and_absolute() -> None:
    with pytest.raises(ConfigError, match="must start with '/'"):
        parse_config({"hf": {"route_prefix": "hf"}})
    with pytest.raises(ConfigError, match="must differ"):
        parse_config({"hf": {"route_prefix": "/x"}, "analysis": {"route_prefix": "/x"}})


def test_memory_utilization_defaults_by_accelerator() -> None:
    engine = PlatformConfig().vllm.engine
    assert engine.memory_utilization("gpu") == 0.90
    assert engine.memory_utilization("cpu") == 0.25
    assert (
        parse_config(
            {"vllm": {"engine": {"gpu_memory_utilization": 0.5}}}
        ).vllm.engine.memory_utilization("gpu")
        == 0.5
    )


def test_served_name_defaults_to_ref() -> None:
    assert parse_config({"model": {"ref": "Qwen/Qwen2.5-0.5B"}}).model.name == "Qwen/Qwen2.5-0.5B"
    assert parse_config({"model": {"ref": "x", "served_name": "y"}}).model.name == "y"


def test_autoscaling_pushes_queue_metrics_at_the_configured_interval() -> None:
    """Ray 2.60's handles and replicas push at the deployment's `metrics_interval_s` (10 s when
    unset, whatever the push-interval variables say): the decision waits on it."""
    import warnings

    from ray.serve.config import AutoscalingConfig

    settings = AutoscalingSettings(max_replicas=2, metrics_interval_s=0.5, look_back_period_s=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the field's deprecation notice
        serve = AutoscalingConfig(**settings.serve_options())
    assert serve.metrics_interval_s == 0.5
    assert serve.look_back_period_s == 2


def test_the_shipped_default_holds_only_what_differs_from_platform_config() -> None:
    """serving/default.yaml repeats no default of PlatformConfig: each of its leaves differs."""
    from importlib import resources

    import yaml

    written = yaml.safe_load(resources.files("serving").joinpath("default.yaml").read_text())
    defaults = PlatformConfig().model_dump(mode="json")

    def repeated(values: dict, base: dict, path: str = "") -> list[str]:
        found = []
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                found += repeated(value, base[key], f"{path}{key}.")
            elif base.get(key) == value:
                found.append(path + key)
        return found

    assert repeated(written, defaults) == []

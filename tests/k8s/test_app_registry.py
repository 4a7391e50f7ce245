"""The App-annotated fields of the platform config are the one list of apps: a toy fourth app
(tests/k8s/toy/echo.py: its deployment module and its one field) reaches the serve config that
local runs and the RayService deploy, and the chart through its generated tables, with nothing
else changed."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve import Application

from serving.config import PlatformConfig
from serving.config import apps as registry
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render
from serving.k8s.serve_config import serve_config_v2
from serving.k8s.templates import TEMPLATE_FILE, generated_template
from tests.k8s.conftest import chart_platform
from tests.k8s.toy.echo import EchoPlatform

ECHO = registry.app_named(EchoPlatform, "echo")


def echo_entry(document: dict[str, Any]) -> dict[str, Any]:
    return next(app for app in document["applications"] if app["name"] == "echo")


def test_the_entries_are_the_annotated_fields_in_order() -> None:
    assert [app.name for app in registry.apps_of(EchoPlatform)] == [
        "vllm",
        "hf",
        "analysis",
        "echo",
    ]
    assert (ECHO.builder, ECHO.deployment, ECHO.scaled) == (
        "tests.k8s.toy.echo:echo_app",
        "Echo",
        False,
    )
    assert "echo" not in {app.name for app in registry.apps_of(PlatformConfig)}


def test_generated_template_is_up_to_date() -> None:
    assert TEMPLATE_FILE.read_text() == generated_template(), (
        "run `llm-serving render chart-tables`"
    )


def test_a_registry_entry_adds_the_app_to_the_serve_config() -> None:
    config = EchoPlatform.model_validate({"echo": {"route_prefix": "/toy"}})
    entry = echo_entry(serve_config_v2(config))
    assert entry["import_path"] == ECHO.builder
    assert entry["route_prefix"] == "/toy"
    assert entry["deployments"] == [{"name": "Echo", "max_ongoing_requests": 4}]
    module, _, name = entry["import_path"].partition(":")
    assert isinstance(getattr(importlib.import_module(module), name)(entry["args"]), Application)


def test_a_disabled_app_is_left_out_and_route_prefixes_stay_distinct() -> None:
    off = EchoPlatform.model_validate({"echo": {"enabled": False}})
    assert "echo" not in {app["name"] for app in serve_config_v2(off)["applications"]}
    with pytest.raises(ValueError, match="route prefixes must differ"):
        EchoPlatform.model_validate({"echo": {"route_prefix": "/hf"}})


def test_the_chart_deploys_the_new_app_from_its_generated_tables(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    (chart / "templates" / TEMPLATE_FILE.name).write_text(generated_template(EchoPlatform()))
    templates = k8s_render.render_templates({}, chart_dir=chart)
    documents = [yaml.safe_load(text) for text in k8s_render.manifest_texts(templates)]
    rayservice = next(doc for doc in documents if doc and doc["kind"] == "RayService")
    rendered = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    platform = EchoPlatform.model_validate(chart_platform(documents, k8s_render.merged_values({})))
    assert rendered == serve_config_v2(platform)
    assert echo_entry(rendered)["route_prefix"] == "/echo"

"""Tenants' keys in the cluster: each tenant's Secret (values tenantKeys) reaches every Ray container
in a variable of its own, which the serve config names as the tenant's api_keys_env; keys written
in platform.auth.tenants[].api_keys, and a Secret for a tenant the platform lacks, fail the render."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from serving.config import PlatformConfig
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render
from tests.k8s.conftest import ray_containers

Doc = dict[str, Any]
KEY = "sk-tenant-secret-1"
TENANTS = [
    {"name": "team-a"},
    {"name": "team-b", "api_keys_env": "TEAM_B_KEYS", "may_set_priority": True},
    {"name": "team-c"},  # no Secret: its keys come from wherever its api_keys_env says (none)
]
VALUES: Doc = {
    "tenantKeys": {
        "team-a": {"existingSecret": "team-a-keys"},
        "team-b": {"existingSecret": "shared-keys", "key": "b"},
    },
    "platform": {"auth": {"tenants": TENANTS}},
}


def rayservice(docs: list[Doc]) -> Doc:
    (found,) = [doc for doc in docs if doc["kind"] == "RayService"]
    return found


def secret_env(container: Doc, prefix: str) -> list[Doc]:
    return [e for e in container["env"] if "valueFrom" in e and e["name"].startswith(prefix)]


def test_each_tenants_secret_reaches_every_ray_container_and_the_serve_config() -> None:
    rendered = rayservice(k8s_render.render_documents(VALUES))
    expected = [
        {
            "name": "LLM_SERVING_TENANT_TEAM_A_KEYS",
            "valueFrom": {"secretKeyRef": {"name": "team-a-keys", "key": "api-keys"}},
        },
        {
            "name": "TEAM_B_KEYS",  # the tenant's own variable wins
            "valueFrom": {"secretKeyRef": {"name": "shared-keys", "key": "b"}},
        },
    ]
    containers = ray_containers(rendered)
    assert len(containers) == 3  # the head, the GPU and the CPU worker groups
    names = {e["name"] for e in expected}
    for container in containers:
        assert [e for e in container["env"] if e["name"] in names] == expected
        assert secret_env(container, "LLM_SERVING_TENANT_") == expected[:1]
    apps = yaml.safe_load(rendered["spec"]["serveConfigV2"])["applications"]
    assert {app["name"] for app in apps} == {"vllm", "hf", "analysis"}
    for app in apps:
        tenants = app["args"]["auth"]["tenants"]
        assert [t.get("api_keys_env") for t in tenants] == [
            "LLM_SERVING_TENANT_TEAM_A_KEYS",
            "TEAM_B_KEYS",
            None,
        ], app["name"]
        assert tenants[1]["may_set_priority"] is True  # the rest of the entry as written
        PlatformConfig.model_validate(app["args"])  # the replicas load it
    assert k8s_render.lint(VALUES) == []


def test_no_tenant_variable_without_tenant_keys() -> None:
    values = {"platform": {"auth": {"tenants": TENANTS}}}
    rendered = rayservice(k8s_render.render_documents(values))
    assert all(secret_env(c, "LLM_SERVING_TENANT_") == [] for c in ray_containers(rendered))
    (vllm, *_) = yaml.safe_load(rendered["spec"]["serveConfigV2"])["applications"]
    assert vllm["args"]["auth"]["tenants"] == TENANTS


def test_a_multi_model_router_and_its_models_read_the_variables_too() -> None:
    values = k8s_render.load_values(CHART_DIR / "ci" / "multi-model-values.yaml")
    values |= {"tenantKeys": VALUES["tenantKeys"]}
    values["platform"] = values["platform"] | VALUES["platform"]
    rendered = rayservice(k8s_render.render_documents(values))
    apps = yaml.safe_load(rendered["spec"]["serveConfigV2"])["applications"]
    routed = [app for app in apps if app["name"] == "vllm" or app["name"].startswith("vllm-")]
    assert len(routed) == 3  # the router and one app per model
    for app in routed:
        variables = [t.get("api_keys_env") for t in app["args"]["auth"]["tenants"]]
        assert variables == ["LLM_SERVING_TENANT_TEAM_A_KEYS", "TEAM_B_KEYS", None], app["name"]


@pytest.mark.parametrize(
    ("platform", "setting"),
    [
        (
            {"auth": {"tenants": [{"name": "team-a"}, {"name": "team-b", "api_keys": [KEY]}]}},
            "platform.auth.tenants[1].api_keys (tenant team-b)",
        ),
        (
            {"analysis": {"auth": {"tenants": [{"name": "team-a", "api_keys": [KEY]}]}}},
            "platform.analysis.auth.tenants[0].api_keys (tenant team-a)",
        ),
    ],
    ids=["platform", "analysis"],
)
def test_inline_tenant_keys_fail_the_render_naming_the_setting(platform: Doc, setting: str) -> None:
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_documents({"platform": platform})
    message = str(err.value)
    assert setting in message and "readable on the Ray dashboard" in message
    assert KEY not in message


@pytest.mark.parametrize(
    ("tenant_keys", "message"),
    [
        (
            {"team-x": {"existingSecret": "x-keys"}},
            'tenantKeys.team-x: platform.auth.tenants has no tenant "team-x" (it has: team-a, '
            "team-b, team-c, default)",
        ),
        (
            {"default": {"existingSecret": "keys"}},
            "tenantKeys.default: the default tenant's keys are those of apiKeys",
        ),
    ],
    ids=["unknown", "default"],
)
def test_a_secret_for_no_tenant_is_refused(tenant_keys: Doc, message: str) -> None:
    tenants = [*TENANTS, {"name": "default"}]
    values = {"tenantKeys": tenant_keys, "platform": {"auth": {"tenants": tenants}}}
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_documents(values)
    assert message in str(err.value)


def test_a_tenant_secret_needs_its_name() -> None:
    with pytest.raises(k8s_render.RenderError, match="missing property 'existingSecret'"):
        k8s_render.render_documents(VALUES | {"tenantKeys": {"team-a": {"key": "k"}}})

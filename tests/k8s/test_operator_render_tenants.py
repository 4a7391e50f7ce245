"""An LLMService's tenants: tenantKeySecrets become the chart's tenantKeys, so each tenant's Secret
reaches every Ray container in the variable the serve config names; keys written in the spec's
platform.auth.tenants, and a Secret for a tenant the platform lacks, are a SpecError."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from operators import render
from operators.spec import SpecError, parse_spec
from tests.k8s.conftest import ray_containers
from tests.k8s.test_operator_render import EXAMPLE

Doc = dict[str, Any]
KEY = "sk-tenant-secret-1"


def with_tenants(tenants: list[Doc], secrets: Doc) -> Doc:
    spec = copy.deepcopy(EXAMPLE)
    spec["platform"]["auth"] = {"tenants": tenants}
    return spec | {"tenantKeySecrets": secrets}


def test_tenant_key_secrets_reach_every_ray_container_and_the_serve_config() -> None:
    tenants = [{"name": "team-a"}, {"name": "team-b", "api_keys_env": "TEAM_B_KEYS"}]
    secrets = {"team-a": {"name": "team-a-keys"}, "team-b": {"name": "shared", "key": "b"}}
    spec = with_tenants(tenants, secrets)
    values = render.chart_values("qwen", parse_spec(spec), render.chart_defaults())
    assert values["tenantKeys"] == {
        "team-a": {"existingSecret": "team-a-keys", "key": "api-keys"},
        "team-b": {"existingSecret": "shared", "key": "b"},
    }
    rayservice = render.render_rayservice("qwen", "ns", spec)
    expected = {
        "LLM_SERVING_TENANT_TEAM_A_KEYS": {"name": "team-a-keys", "key": "api-keys"},
        "TEAM_B_KEYS": {"name": "shared", "key": "b"},
    }
    containers = ray_containers(rayservice)
    assert len(containers) == 2  # the head and the GPU workers
    for container in containers:
        refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container["env"]}
        assert {name: refs.get(name) for name in expected} == expected
    (vllm,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    assert vllm["args"]["auth"]["tenants"] == [
        {"name": "team-a", "api_keys_env": "LLM_SERVING_TENANT_TEAM_A_KEYS"},
        {"name": "team-b", "api_keys_env": "TEAM_B_KEYS"},
    ]


def test_no_tenant_key_secrets_no_tenant_variables() -> None:
    rayservice = render.render_rayservice("qwen", "ns", with_tenants([{"name": "team-a"}], {}))
    for container in ray_containers(rayservice):
        assert not [e for e in container["env"] if e["name"].startswith("LLM_SERVING_TENANT_")]


@pytest.mark.parametrize(
    ("tenants", "secrets", "message"),
    [
        (
            [{"name": "team-a"}, {"name": "team-b", "api_keys": [KEY]}],
            {},
            "platform.auth.tenants[1].api_keys: API keys written in the spec would travel",
        ),
        (
            [{"name": "team-a"}],
            {"team-a": {"name": "a"}, "team-x": {"name": "x"}},
            "tenantKeySecrets: team-x: no such tenant in platform.auth.tenants",
        ),
        (
            [{"name": "default"}],
            {"default": {"name": "keys"}},
            "tenantKeySecrets: default: no such tenant",
        ),
    ],
    ids=["inline-keys", "unknown-tenant", "default-tenant"],
)
def test_what_the_spec_refuses(tenants: list[Doc], secrets: Doc, message: str) -> None:
    with pytest.raises(SpecError) as err:
        render.render_rayservice("qwen", "ns", with_tenants(tenants, secrets))
    assert message in str(err.value)
    assert "the chart refused" not in str(err.value)  # refused before rendering
    assert KEY not in str(err.value)

"""An LLMService's store: the PostgreSQL server platform.state.url names, its password from the
Secret stateSecret names, in every Ray container; the operator deploys no server of its own."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from operators import crd, render
from operators.spec import SpecError, parse_spec
from serving.k8s import chart as k8s_render
from tests.k8s.conftest import ray_containers
from tests.k8s.schemas import crd_errors, crds_available
from tests.k8s.test_operator_render import EXAMPLE

Doc = dict[str, Any]
URL = "postgresql+psycopg://serving@db.team.svc:5432/serving"


def with_state(state: Doc | None, secret: Doc | None) -> Doc:
    spec = copy.deepcopy(EXAMPLE)
    if state is not None:
        spec["platform"] = spec.get("platform", {}) | {"state": state}
    if secret is not None:
        spec["stateSecret"] = secret
    return spec


def vllm_state(rayservice: Doc) -> Doc:
    (app,) = [
        a
        for a in yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
        if a["name"] == "vllm"
    ]
    return app["args"].get("state", {})


def state_env(rayservice: Doc, name: str) -> list[list[Doc]]:
    return [[e for e in c["env"] if e["name"] == name] for c in ray_containers(rayservice)]


def test_a_state_section_renders_the_postgresql_reference() -> None:
    spec = with_state({"url": URL, "ttl_s": 3600}, {"name": "team-db", "key": "pw"})
    owned = render.render_owned("qwen", "team", spec)
    rayservice = owned.rayservice
    assert vllm_state(rayservice) == {"url": URL, "ttl_s": 3600}
    ref = {"secretKeyRef": {"name": "team-db", "key": "pw"}}
    expected = [{"name": "LLM_SERVING_STATE_PASSWORD", "valueFrom": ref}]
    assert state_env(rayservice, "LLM_SERVING_STATE_PASSWORD") == [expected] * len(
        ray_containers(rayservice)
    )
    if crds_available():
        assert crd_errors(rayservice) == []


def test_the_operator_deploys_no_server_and_no_secret() -> None:
    typed = parse_spec(with_state({"url": URL}, {"name": "team-db"}))
    values = render.chart_values("qwen", typed, render.chart_defaults())
    assert values["state"] == {
        "postgresql": {"enabled": False},
        "allowUnshared": True,
        "existingSecret": "team-db",
        "secretKey": "password",
    }
    docs = k8s_render.render_documents(values, release="qwen", namespace="team")
    assert sorted(doc["kind"] for doc in docs) == [
        "NetworkPolicy",
        "PodDisruptionBudget",
        "RayService",
    ]


def test_without_a_state_section_each_pod_keeps_its_own() -> None:
    rayservice = render.render_owned("qwen", "team", with_state(None, None)).rayservice
    assert "url" not in vllm_state(rayservice)
    assert state_env(rayservice, "LLM_SERVING_STATE_PASSWORD") == [[]] * len(
        ray_containers(rayservice)
    )


def test_a_state_secret_needs_the_servers_url() -> None:
    with pytest.raises(SpecError, match="stateSecret is the password of the server"):
        render.render_owned("qwen", "team", with_state(None, {"name": "team-db"}))


def test_the_crd_takes_the_state_secret() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(schema)
    resource: Doc = {
        "apiVersion": "serving.llm-serving.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "qwen"},
        "spec": with_state({"url": URL}, {"name": "team-db", "key": "pw"}),
    }
    validator.validate(resource)
    bad = copy.deepcopy(resource)
    bad["spec"]["stateSecret"] = {"key": "pw"}  # no name
    assert not validator.is_valid(bad)

"""API keys in the cluster: the chart puts a Secret's keys into every Ray container's environment
(the variable `platform.auth.api_keys_env` names), creates the Secret from `apiKeys.value`, and
never writes a key into the RayService itself."""

from __future__ import annotations

import base64

from serving.k8s import chart as k8s_render
from tests.k8s.conftest import ray_containers

STATE_PASSWORD_ENV = "LLM_SERVING_STATE_PASSWORD"


def key_env(docs: list[dict]) -> list[list[dict]]:
    """Each Ray container's variables from Secrets, but the store's password (test_chart_state)."""
    (rayservice,) = [doc for doc in docs if doc["kind"] == "RayService"]
    return [
        [e for e in c["env"] if "valueFrom" in e and e["name"] != STATE_PASSWORD_ENV]
        for c in ray_containers(rayservice)
    ]


def key_secrets(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "Secret" and not k8s_render.is_generated_password(d)]


def test_no_keys_by_default() -> None:
    docs = k8s_render.render_documents({})
    assert all(env == [] for env in key_env(docs))
    assert not key_secrets(docs)


def test_value_becomes_a_secret_every_ray_container_reads() -> None:
    docs = k8s_render.render_documents({"apiKeys": {"value": "sk-a,sk-b"}})
    (secret,) = key_secrets(docs)
    assert base64.b64decode(secret["data"]["api-keys"]) == b"sk-a,sk-b"
    expected = {
        "name": "LLM_SERVING_API_KEYS",
        "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "api-keys"}},
    }
    assert all(env == [expected] for env in key_env(docs))
    (rayservice,) = [doc for doc in docs if doc["kind"] == "RayService"]
    assert "sk-a" not in str(rayservice)


def test_existing_secret_in_the_variable_the_config_names() -> None:
    values = {
        "apiKeys": {"existingSecret": "team-keys", "key": "keys"},
        "platform": {"auth": {"api_keys_env": "TEAM_KEYS"}},
    }
    docs = k8s_render.render_documents(values)
    assert not key_secrets(docs)
    expected = {
        "name": "TEAM_KEYS",
        "valueFrom": {"secretKeyRef": {"name": "team-keys", "key": "keys"}},
    }
    assert all(env == [expected] for env in key_env(docs))
    assert k8s_render.lint(values) == []

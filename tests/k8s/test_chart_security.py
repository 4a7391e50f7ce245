"""Secure by default on a cluster: Ray's token authentication (RayService authOptions) is on, a
NetworkPolicy lets into the Ray pods only the serving port from anywhere, metrics from the
monitoring namespace and the dashboard from KubeRay's operator (Ray's own ports only from the
release's Ray pods), API keys come only from a Secret (inline keys fail the render naming the
setting), and no rendered object but that Secret holds a key."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from serving.k8s import chart as k8s_render
from tests.k8s.conftest import Rendered, ray_containers
from tests.k8s.schemas import K8S_VERSIONS, crd_errors, crds_available, k8s_errors

KEY = "sk-live-0123456789abcdef"
Doc = dict[str, Any]


def one(docs: list[Doc], kind: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def ray_policy(docs: list[Doc]) -> Doc:
    """The NetworkPolicy over the Ray pods (the store's server has its own: test_chart_state)."""
    (doc,) = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-ray")
    ]
    return doc


def ray_pod_labels(rayservice: Doc) -> list[dict[str, str]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    return [template["metadata"]["labels"] for template in templates]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def rule_for(policy: Doc, port: int | str) -> list[Doc]:
    return [
        r
        for r in policy["spec"]["ingress"]
        if {"port": port, "protocol": "TCP"} in r.get("ports", [])
    ]


def test_ray_token_auth_on_in_every_case(case: Rendered) -> None:
    assert case.one("RayService")["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}


@pytest.mark.skipif(not crds_available(), reason="KubeRay CRD schemas not found")
@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        ({"mode": "disabled"}, {"mode": "disabled"}),
        ({"secretName": "ray-token"}, {"mode": "token", "secretName": "ray-token"}),
    ],
)
def test_ray_auth_values(auth: Doc, expected: Doc) -> None:
    rayservice = one(k8s_render.render_documents({"ray": {"auth": auth}}), "RayService")
    assert rayservice["spec"]["rayClusterConfig"]["authOptions"] == expected
    assert crd_errors(rayservice) == []


def test_network_policy_on_in_every_case(case: Rendered) -> None:
    policy = ray_policy(case.docs)
    assert [p for v in K8S_VERSIONS for p in k8s_errors(policy, v)] == []
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert all(selects(selector, labels) for labels in ray_pod_labels(case.one("RayService")))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    port = case.platform.http.port
    (serving,) = rule_for(policy, port)
    assert "from" not in serving  # the API (guarded by API keys) from anywhere
    (metrics,) = rule_for(policy, 8080)
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    (dashboard,) = rule_for(policy, 8265)
    assert dashboard["from"] == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
        }
    ]
    # Every port, Ray's GCS (6379), client (10001) and dashboard among them, only from the
    # release's own Ray pods.
    (internal,) = [r for r in policy["spec"]["ingress"] if "ports" not in r]
    assert internal["from"] == [{"podSelector": {"matchLabels": selector}}]


def test_network_policy_serving_from_keeps_the_helm_test_pod() -> None:
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}]
    docs = k8s_render.render_documents({"networkPolicy": {"servingFrom": peers}})
    policy, test_pod = ray_policy(docs), one(docs, "Pod")
    (serving,) = rule_for(policy, 8000)
    assert serving["from"][0] == peers[0]
    assert any(
        set(peer) == {"podSelector"}
        and selects(peer["podSelector"]["matchLabels"], test_pod["metadata"]["labels"])
        for peer in serving["from"]
    )


def test_network_policy_off() -> None:
    docs = k8s_render.render_documents({"networkPolicy": {"enabled": False}})
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    ("platform", "setting"),
    [
        ({"auth": {"api_keys": [KEY]}}, "platform.auth.api_keys"),
        ({"analysis": {"auth": {"api_keys": [KEY]}}}, "platform.analysis.auth.api_keys"),
    ],
)
def test_inline_keys_fail_the_render_naming_the_setting(platform: Doc, setting: str) -> None:
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_documents({"platform": platform})
    message = str(err.value)
    assert setting in message and "apiKeys.existingSecret" in message
    assert KEY not in message


def test_no_rendered_object_but_the_secret_holds_a_key() -> None:
    values = {"apiKeys": {"value": KEY}, "operator": {"enabled": True}}
    docs = k8s_render.render_documents(values)
    encoded = base64.b64encode(KEY.encode()).decode()
    holders = [d["kind"] for d in docs if KEY in json.dumps(d) or encoded in json.dumps(d)]
    assert holders == ["Secret"]
    serve_config = yaml.safe_load(one(docs, "RayService")["spec"]["serveConfigV2"])
    assert "api_keys" not in json.dumps(serve_config)
    assert all(KEY not in json.dumps(c) for c in ray_containers(one(docs, "RayService")))


def test_helm_test_sends_the_key_from_the_secret() -> None:
    values = {"apiKeys": {"existingSecret": "team-keys", "key": "keys"}}
    pod = one(k8s_render.render_documents(values), "Pod")
    (container,) = pod["spec"]["containers"]
    assert {
        "name": "API_KEYS",
        "valueFrom": {"secretKeyRef": {"name": "team-keys", "key": "keys"}},
    } in container["env"]
    script = container["args"][0]
    assert 'headers["Authorization"] = "Bearer " + os.environ["API_KEYS"]' in script


def test_notes_tell_where_the_ray_token_is() -> None:
    assert "jsonpath='{.data.auth_token}'" in k8s_render.notes({})
    assert "auth_token" not in k8s_render.notes({"ray": {"auth": {"mode": "disabled"}}})


def test_notes_curl_sends_the_key_when_keys_are_on() -> None:
    notes = k8s_render.notes({"apiKeys": {"existingSecret": "team-keys"}})
    assert "get secret team-keys -o jsonpath='{.data.api-keys}'" in notes
    assert '-H "Authorization: Bearer $KEY"' in notes
    assert "Authorization" not in k8s_render.notes({})

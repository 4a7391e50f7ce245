"""The platform's store in the chart: by default a PostgreSQL StatefulSet with its claim, Service,
NetworkPolicy and a generated password Secret; or an existing server (platform.state.url and its
Secret). Every Ray container reads the password from the Secret, the vLLM apps' args carry the
URL, and a release whose replicas would keep a SQLite file per pod is refused."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from serving.k8s import chart as k8s_render
from tests.k8s.conftest import Rendered, component, ray_containers, rendered
from tests.k8s.schemas import K8S_VERSIONS, k8s_errors

Doc = dict[str, Any]
PASSWORD_ENV = "LLM_SERVING_STATE_PASSWORD"
EXTERNAL = "postgresql+psycopg://serving@db.example.com:5432/serving"
NO_SERVER = {"state": {"postgresql": {"enabled": False}}}


def state_objects(docs: list[Doc]) -> dict[str, Doc]:
    return {doc["kind"]: doc for doc in docs if component(doc) == "state"}


def vllm_args(docs: list[Doc]) -> list[Doc]:
    """The args of every app that opens the store: vllm, or the router and each model's app."""
    (rayservice,) = [doc for doc in docs if doc["kind"] == "RayService"]
    apps = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    return [app["args"] for app in apps if app["name"].startswith("vllm")]


def password_env(docs: list[Doc]) -> list[list[Doc]]:
    (rayservice,) = [doc for doc in docs if doc["kind"] == "RayService"]
    return [[e for e in c["env"] if "STATE" in e["name"]] for c in ray_containers(rayservice)]


def test_the_default_deploys_postgresql_and_points_every_replica_at_it() -> None:
    case = rendered("default")
    objects = state_objects(case.docs)
    assert set(objects) == {"Secret", "Service", "StatefulSet", "NetworkPolicy"}
    secret, service, statefulset = objects["Secret"], objects["Service"], objects["StatefulSet"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "password"}}
    assert password_env(case.docs) == [[{"name": PASSWORD_ENV, "valueFrom": ref}]] * 3
    url = f"postgresql+psycopg://llm_serving@{service['metadata']['name']}:5432/llm_serving"
    assert [args["state"]["url"] for args in vllm_args(case.docs)] == [url]
    assert case.platform.state.url == url  # PlatformConfig takes it: no password in it
    pod = statefulset["spec"]["template"]
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("postgres:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["password"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert env["POSTGRES_PASSWORD_FILE"].endswith("/password")
    assert env["POSTGRES_USER"] == "llm_serving" and env["POSTGRES_DB"] == "llm_serving"
    for doc in objects.values():
        assert [p for v in K8S_VERSIONS for p in k8s_errors(doc, v)] == []


def test_the_database_lives_on_the_statefulsets_claim() -> None:
    persistence = {"storageClassName": "fast-ssd", "size": "20Gi"}
    docs = k8s_render.render_documents({"state": {"postgresql": {"persistence": persistence}}})
    statefulset = state_objects(docs)["StatefulSet"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert claim["metadata"]["name"] == "data"
    assert env_of(container)["PGDATA"].startswith(mounts["data"] + "/")
    off = {"state": {"postgresql": {"persistence": {"enabled": False}}}}
    statefulset = state_objects(k8s_render.render_documents(off))["StatefulSet"]
    assert "volumeClaimTemplates" not in statefulset
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def env_of(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_only_the_releases_ray_pods_reach_the_database() -> None:
    case = rendered("default")
    objects = state_objects(case.docs)
    policy, pod = objects["NetworkPolicy"], objects["StatefulSet"]["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
    (peer,) = rule["from"]
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    labels = cluster["headGroupSpec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_an_existing_server_gets_its_url_and_secret() -> None:
    case = rendered("external-state")
    assert state_objects(case.docs) == {}
    assert not case.kinds("StatefulSet")
    ref = {"secretKeyRef": {"name": "llm-serving-db", "key": "password"}}
    expected = [{"name": "DB_PASSWORD", "valueFrom": ref}]
    for container in ray_containers(case.one("RayService")):
        assert [e for e in container["env"] if e["name"] == "DB_PASSWORD"] == expected
    url = case.values["platform"]["state"]["url"]
    assert [args["state"]["url"] for args in vllm_args(case.docs)] == [url]
    assert k8s_render.lint(case.values) == []


def test_an_existing_secret_serves_the_bundled_server_too() -> None:
    docs = k8s_render.render_documents({"state": {"existingSecret": "db"}})
    objects = state_objects(docs)
    assert "Secret" not in objects
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["password"]["secret"]["secretName"] == "db"
    assert {e["valueFrom"]["secretKeyRef"]["name"] for c in password_env(docs) for e in c} == {"db"}


def test_every_model_app_and_the_router_open_the_same_store() -> None:
    case = rendered("multi-model")
    args = vllm_args(case.docs)
    assert len(args) == 3  # the router and two models
    assert {a["state"]["url"] for a in args} == {case.store_url}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (NO_SERVER, "no shared store"),
        (
            {**NO_SERVER, "platform": {"state": {"url": "sqlite:////models/state.db"}}},
            "its own SQLite file",
        ),
        (
            {"platform": {"state": {"url": EXTERNAL}}},
            "state.postgresql.enabled=true would deploy another one",
        ),
    ],
)
def test_a_store_the_pods_do_not_share_is_refused(values: Doc, message: str) -> None:
    with pytest.raises(k8s_render.RenderError, match=message):
        k8s_render.render_documents(values)


def test_sqlite_serves_a_single_pod_or_when_accepted() -> None:
    one_pod = {
        **NO_SERVER,
        "ray": {"upgradeStrategy": "None"},
        "workers": {"gpu": {"maxReplicas": 1}, "cpu": {"enabled": False}},
        "platform": {
            "vllm": {"autoscaling": {"max_replicas": 1}},
            "hf": {"enabled": False},
            "analysis": {"enabled": False},
        },
    }
    accepted = {"state": {"postgresql": {"enabled": False}, "allowUnshared": True}}
    for values in (one_pod, accepted):
        docs = k8s_render.render_documents(values)
        assert state_objects(docs) == {}
        assert all(env == [] for env in password_env(docs))
        assert all("url" not in args.get("state", {}) for args in vllm_args(docs))


def test_the_kubectl_manifests_leave_the_password_out() -> None:
    for case in ("default", "cpu-dev"):
        text = k8s_render.rendered_manifest(
            None if case == "default" else "helm/llm-serving/ci/cpu-dev-values.yaml"
        )
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
        assert "Secret" not in {doc["kind"] for doc in docs}
        assert "kubectl create secret generic llm-serving-state" in text
        assert "StatefulSet" in {doc["kind"] for doc in docs}


def test_every_case_shares_one_postgresql(case: Rendered) -> None:
    """Every scenario in ci/ may run replicas on several pods: all of them open one server."""
    url = case.platform.state.url
    assert url is not None and url.startswith("postgresql+psycopg://")
    assert {args["state"]["url"] for args in vllm_args(case.docs)} == {url}
    assert url in (case.store_url, case.values.get("platform", {}).get("state", {}).get("url"))


def test_the_install_notes_name_the_store() -> None:
    assert "the PostgreSQL at postgresql+psycopg://llm_serving@llm-serving-state:5432" in (
        rendered("default").notes
    )
    assert "(StatefulSet llm-serving-state:" in rendered("default").notes
    external = rendered("external-state")
    assert f"the PostgreSQL at {external.platform.state.url}." in external.notes

"""The chart's operator toggle ships the generated CRD (k8s/crds/), RBAC limited to llmservices,
rayservices and events, and the `kopf run -m operators.llmservice` Deployment; off by default.
k8s/operator/operator.yaml is rendered from the same template (test_generated checks it is
current). Rendered from a copy of the chart without values.schema.json, so the
templates are checked whether or not the values file declares `operator` yet."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import yaml

from operators import crd
from serving.k8s import CHART_DIR, REPO_ROOT
from serving.k8s import chart as k8s_render
from tests.k8s.schemas import document_errors

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def operator_docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Doc]:
    chart = tmp_path_factory.mktemp("chart") / "llm-serving"
    shutil.copytree(CHART_DIR, chart)
    (chart / "values.schema.json").unlink(missing_ok=True)
    texts = k8s_render.render_templates(
        {"operator": {"enabled": True}}, release="llm", chart_dir=chart
    )
    found = [
        doc
        for name, text in texts.items()
        if "templates/operator" in name
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return {doc["kind"]: doc for doc in found}


def test_operator_is_off_by_default() -> None:
    texts = k8s_render.render_templates({})
    assert not [n for n, t in texts.items() if "templates/operator" in n and yaml.safe_load(t)]


def test_chart_ships_the_generated_crd(operator_docs: dict[str, Doc]) -> None:
    shipped = operator_docs["CustomResourceDefinition"]
    assert shipped["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert shipped == crd.crd_manifest() == yaml.safe_load(crd.CRD_PATH.read_text())


def test_operator_rbac_is_limited_to_what_it_touches(operator_docs: dict[str, Doc]) -> None:
    binding = operator_docs["ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == operator_docs["ServiceAccount"]["metadata"]["name"]
    assert binding["roleRef"]["name"] == operator_docs["ClusterRole"]["metadata"]["name"]
    rules = operator_docs["ClusterRole"]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {
        "llmservices",
        "llmservices/status",
        "llmservices/finalizers",
        "rayservices",
        "networkpolicies",
        "poddisruptionbudgets",
        "events",
        "persistentvolumeclaims",
    }
    # blockOwnerDeletion on the RayService's owner reference needs update on the finalizers.
    finalizers = next(r for r in rules if "llmservices/finalizers" in r["resources"])
    assert finalizers["verbs"] == ["update"]


def test_chart_deployment_runs_the_operator_module(operator_docs: dict[str, Doc]) -> None:
    pod = operator_docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:4] == ["kopf", "run", "-m", "operators.llmservice"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_kubectl_manifest_is_the_chart_in_its_own_namespace() -> None:
    docs = [d for d in yaml.safe_load_all(k8s_render.OPERATOR_FILE.read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert docs[0]["kind"] == "Namespace" and len(kinds) == len(docs) == 5
    namespace = docs[0]["metadata"]["name"]
    for kind in ("ServiceAccount", "Deployment"):
        assert kinds[kind]["metadata"]["namespace"] == namespace
    assert kinds["ClusterRoleBinding"]["subjects"][0]["namespace"] == namespace


def test_operator_manifests_validate(operator_docs: dict[str, Doc]) -> None:
    docs = list(operator_docs.values())
    docs += [d for d in yaml.safe_load_all(k8s_render.OPERATOR_FILE.read_text()) if d]
    assert [problem for doc in docs for problem in document_errors(doc)] == []


def test_example_resource_matches_the_crd() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    example = yaml.safe_load((REPO_ROOT / "k8s" / "examples" / "llmservice.yaml").read_text())
    # OpenAPI v3 schemas are draft-4 style (boolean exclusiveMinimum); `nullable` and
    # `x-kubernetes-int-or-string` are extensions jsonschema ignores.
    jsonschema.Draft4Validator(schema).validate(example)


def test_pod_settings_pass_the_crd_and_bad_ones_do_not() -> None:
    from tests.k8s.test_operator_render import settled_spec

    jsonschema = pytest.importorskip("jsonschema")
    schema = crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(schema)
    spec = settled_spec()
    resource = {
        "apiVersion": "serving.llm-serving.io/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "qwen"},
        "spec": spec,
    }
    validator.validate(resource)
    bad = {**spec, "pods": {"tolerations": [{"operator": "Sometimes"}]}}
    assert not validator.is_valid({**resource, "spec": bad})

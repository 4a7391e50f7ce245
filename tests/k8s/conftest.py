"""The values matrix, rendered once per session with Helm's engine (helm-python-sdk)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.config import PlatformConfig
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render

CI_DIR = CHART_DIR / "ci"
MATRIX = sorted(p.name.removesuffix("-values.yaml") for p in CI_DIR.glob("*-values.yaml"))
Doc = dict[str, Any]


def values_of(case: str) -> dict[str, Any]:
    return k8s_render.load_values(CI_DIR / f"{case}-values.yaml")


class Rendered:
    """Rendered documents, merged values and notes of one values file."""

    def __init__(self, case: str) -> None:
        self.case = case
        self.values = values_of(case)
        self.merged = k8s_render.merged_values(self.values)
        templates = k8s_render.render_templates(self.values)
        self.docs: list[Doc] = [
            k8s_render.masked_password(yaml.safe_load(t))
            for t in k8s_render.manifest_texts(templates)
        ]
        self.notes = next(t for name, t in templates.items() if name.endswith("NOTES.txt"))

    def kinds(self, kind: str) -> list[Doc]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str) -> Doc:
        (doc,) = self.kinds(kind)
        return doc

    @property
    def store_url(self) -> str | None:
        return store_url(self.docs, self.merged)

    @property
    def platform(self) -> PlatformConfig:
        return PlatformConfig.model_validate(chart_platform(self.docs, self.merged))


def component(doc: Doc) -> str | None:
    return (doc["metadata"].get("labels") or {}).get("app.kubernetes.io/component")


def store_url(docs: list[Doc], merged: dict[str, Any]) -> str | None:
    """The bundled PostgreSQL's URL, from its Service and the values; None without it."""
    services = [d for d in docs if d["kind"] == "Service" and component(d) == "state"]
    if not services:
        return None
    postgresql = merged["state"]["postgresql"]
    host, port = services[0]["metadata"]["name"], services[0]["spec"]["ports"][0]["port"]
    return f"postgresql+psycopg://{postgresql['user']}@{host}:{port}/{postgresql['database']}"


def chart_platform(docs: list[Doc], merged: dict[str, Any]) -> dict[str, Any]:
    """The platform the chart's serve config stands for: the values', with the store the chart
    points the replicas at (its own server's URL)."""
    platform = copy.deepcopy(merged["platform"])
    if url := store_url(docs, merged):
        platform.setdefault("state", {})["url"] = url
    return platform


_CACHE: dict[str, Rendered] = {}


def rendered(case: str) -> Rendered:
    if case not in _CACHE:
        _CACHE[case] = Rendered(case)
    return _CACHE[case]


@pytest.fixture(params=MATRIX)
def case(request: pytest.FixtureRequest) -> Rendered:
    return rendered(request.param)


def ray_containers(rayservice: Doc) -> list[Doc]:
    """The Ray container (index 0, as KubeRay requires) of the head and of every worker group."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster.get("workerGroupSpecs") or []]
    return [template["spec"]["containers"][0] for template in templates]


def pod_documents(rayservice: Doc) -> list[Doc]:
    """Pods KubeRay would create from the RayService's templates (for scanners that skip CRDs)."""
    name = rayservice["metadata"]["name"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"]["template"])]
    groups += [
        (f"{g['groupName']}-worker", g["template"]) for g in cluster.get("workerGroupSpecs") or []
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template.get("metadata", {}), "name": f"{name}-{suffix}"},
            "spec": template["spec"],
        }
        for suffix, template in groups
    ]


def repo_path(*parts: str) -> Path:
    return CHART_DIR.parent.parent.joinpath(*parts)

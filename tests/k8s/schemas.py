"""Offline schema checks for rendered manifests, shared by the chart and operator tests.

Built-in kinds: kubernetes-validate's strict schemas (unknown fields fail). KubeRay kinds: the CRD's
openAPIV3Schema from ../shared/reference/crds, closed the same way, so a misspelt field fails here
instead of being pruned silently by the API server."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT.parent / "shared" / "reference" / "crds"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
# Prometheus-operator kinds have no schema here; their shape is checked by the chart tests.
UNCHECKED_KINDS = {"ServiceMonitor", "PodMonitor"}
K8S_VERSIONS = ("1.30", "1.37")


def k8s_errors(doc: dict[str, Any], version: str) -> list[str]:
    """Problems kubernetes-validate (strict) finds in a built-in kind; [] when valid."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(p) for p in err.path)
        return [
            f"{doc['kind']}/{doc['metadata']['name']} (k8s {version}) at {where}: {err.message}"
        ]
    return []


def crds_available() -> bool:
    return all((CRD_DIR / name).is_file() for name in CRD_FILES.values())


@functools.cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are ~1 MB each
    crd = yaml.load((CRD_DIR / CRD_FILES[kind]).read_text(), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = closed_schema(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def closed_schema(schema: Any) -> Any:
    """Copy of a structural CRD schema where objects with listed properties reject other keys,
    as the API server's pruning would drop them (unless x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [closed_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed_schema(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def crd_errors(doc: dict[str, Any]) -> list[str]:
    validator = crd_validator(doc["kind"])
    return [
        f"{doc['kind']}/{doc['metadata']['name']} at {'/'.join(map(str, e.path))}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def document_errors(doc: dict[str, Any]) -> list[str]:
    """Every schema problem of one rendered document, across the checked Kubernetes versions."""
    kind = doc["kind"]
    if kind in CRD_FILES:
        return crd_errors(doc) if crds_available() else []
    if kind in UNCHECKED_KINDS:
        return []
    return [problem for version in K8S_VERSIONS for problem in k8s_errors(doc, version)]

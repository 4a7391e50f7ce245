"""Every rendered document validates: built-in kinds against Kubernetes 1.30 and 1.37 (strict, so
unknown fields fail), RayService against KubeRay's CRD schema (../shared/reference/crds)."""

from __future__ import annotations

import copy

import pytest

from tests.k8s.conftest import Rendered, rendered
from tests.k8s.schemas import (
    CRD_DIR,
    K8S_VERSIONS,
    crd_errors,
    crds_available,
    document_errors,
    k8s_errors,
)

needs_crds = pytest.mark.skipif(
    not crds_available(), reason=f"KubeRay CRD schemas not found in {CRD_DIR}"
)


def test_builtin_kinds_validate(case: Rendered) -> None:
    builtin = [
        doc
        for doc in case.docs
        if doc["kind"] not in ("RayService", "ServiceMonitor", "PodMonitor")
    ]
    assert builtin
    problems = [p for doc in builtin for version in K8S_VERSIONS for p in k8s_errors(doc, version)]
    assert problems == []


@needs_crds
def test_rayservice_validates_against_kuberay_crd(case: Rendered) -> None:
    assert crd_errors(case.one("RayService")) == []


@needs_crds
def test_crd_check_catches_a_misspelt_field() -> None:
    rayservice = copy.deepcopy(rendered("default").one("RayService"))
    rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplica"] = 4
    assert any("'maxReplica' was unexpected" in p for p in document_errors(rayservice))


def test_prometheus_monitors_have_endpoints(case: Rendered) -> None:
    for doc in case.kinds("ServiceMonitor"):
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["spec"]["endpoints"][0]["port"] == "metrics"
    for doc in case.kinds("PodMonitor"):
        assert doc["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"

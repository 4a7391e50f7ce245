"""How the chart asks KubeRay to upgrade: NewClusterWithIncrementalUpgrade renders the
clusterUpgradeOptions KubeRay requires (its utils/validation.go), and the chart refuses what
KubeRay would refuse, at install time."""

from __future__ import annotations

from typing import Any

import pytest

from serving.k8s import chart
from tests.k8s.schemas import crd_errors, crds_available

INCREMENTAL = {
    "ray": {
        "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
        "incrementalUpgrade": {"gatewayClassName": "istio", "stepSizePercent": 10},
    }
}


def rayservice(values: dict[str, Any]) -> dict[str, Any]:
    (doc,) = [d for d in chart.render_documents(values) if d["kind"] == "RayService"]
    return doc


def test_incremental_upgrade_renders_the_options_kuberay_requires() -> None:
    """Failed before: the strategy was accepted and rendered without clusterUpgradeOptions, which
    KubeRay refuses ("ClusterUpgradeOptions are required")."""
    strategy = rayservice(INCREMENTAL)["spec"]["upgradeStrategy"]
    assert strategy == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {
            "gatewayClassName": "istio",
            "stepSizePercent": 10,
            "intervalSeconds": 30,
            "maxSurgePercent": 100,
        },
    }


@pytest.mark.skipif(not crds_available(), reason="KubeRay CRD schemas not found")
def test_incremental_upgrade_validates_against_kuberays_crd() -> None:
    assert crd_errors(rayservice(INCREMENTAL)) == []


def test_other_strategies_carry_no_upgrade_options() -> None:
    assert rayservice({})["spec"]["upgradeStrategy"] == {"type": "NewCluster"}


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        (
            {"ray": {"upgradeStrategy": "NewClusterWithIncrementalUpgrade"}},
            "ray.incrementalUpgrade.gatewayClassName: NewClusterWithIncrementalUpgrade",
        ),
        (
            {**INCREMENTAL, "autoscaler": {"enabled": False}},
            "autoscaler.enabled: NewClusterWithIncrementalUpgrade needs Ray's autoscaler",
        ),
        (
            {
                "ray": {
                    "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
                    "incrementalUpgrade": {"gatewayClassName": "eg", "maxSurgePercent": 20},
                }
            },
            "stepSizePercent (25) must not exceed maxSurgePercent (20)",
        ),
    ],
)
def test_what_kuberay_would_refuse_fails_the_install(values: dict[str, Any], fragment: str) -> None:
    with pytest.raises(chart.RenderError) as caught:
        chart.render_templates(values)
    assert fragment in str(caught.value)

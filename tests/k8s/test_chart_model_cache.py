"""The model cache claim binds where its pods run (issue 35, finding 6): a ReadWriteOnce claim is
attached to one node, so more than one pod able to mount it (worker pods of every group, and an
upgrade's second RayCluster) is refused with what to set; a shared layout asks for ReadWriteMany.
Pods change a volume's ownership only when its root does not match (fsGroupChangePolicy)."""

from __future__ import annotations

from typing import Any

import pytest

from serving.k8s import chart as k8s_render
from tests.k8s.conftest import Rendered, pod_documents, rendered

CLAIM = {"model": {"cache": {"persistentVolumeClaim": {"enabled": True}}}}
# One worker pod that no second cluster ever joins: a ReadWriteOnce claim works.
ONE_POD = {
    "ray": {"upgradeStrategy": "None"},
    "workers": {"gpu": {"maxReplicas": 1}, "cpu": {"enabled": False}},
    "platform": {
        "hf": {"enabled": False},
        "analysis": {"enabled": False},
        "vllm": {"autoscaling": {"max_replicas": 1}, "max_surge_percent": 0},
    },
}


def refusal(values: dict[str, Any]) -> str:
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_templates(values)
    return str(err.value)


def test_a_read_write_once_claim_on_many_pods_is_refused() -> None:
    message = refusal(CLAIM)
    assert "model.cache.persistentVolumeClaim.accessModes" in message
    assert "up to 12 worker pods" in message  # (4 GPU + 2 CPU) x 2 clusters during an upgrade
    assert "accessModes=[ReadWriteMany]" in message
    assert "persistentVolumeClaim.enabled=false" in message


def test_an_upgrades_second_cluster_counts() -> None:
    values = ONE_POD | CLAIM | {"ray": {"upgradeStrategy": "NewCluster"}}
    assert "up to 2 worker pods" in refusal(values)


def test_a_read_write_once_claim_on_one_pod_renders() -> None:
    docs = k8s_render.render_documents(ONE_POD | CLAIM)
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_shared_claims_read_write_many() -> None:
    for name in ("gpu-cluster", "pvc-cache"):
        claim = rendered(name).one("PersistentVolumeClaim")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], name


def test_volume_ownership_changes_only_on_a_root_mismatch(case: Rendered) -> None:
    for pod in pod_documents(case.one("RayService")):
        assert pod["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"

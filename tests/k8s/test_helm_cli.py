"""Cross-checks with the real `helm` CLI (v4): `helm template` renders what the SDK renders, and the
KubeRay prerequisite check fires against an API server without ray.io/v1 (a loopback fake)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from serving.k8s import chart as k8s_render
from tests.k8s.conftest import CI_DIR, MATRIX, rendered, repo_path
from tests.k8s.fake_apiserver import fake_cluster

CHART = repo_path("helm", "llm-serving")


def helm_binary() -> str | None:
    candidates = [os.environ.get("HELM"), str(repo_path(".venv", "tools", "bin", "helm"))]
    found = [c for c in candidates if c and Path(c).is_file()]
    return found[0] if found else shutil.which("helm")


@pytest.fixture
def helm(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = helm_binary()
    if binary is None:
        pytest.skip("no helm CLI: `make install` extracts one into .venv/tools/bin/helm")
    homes = {
        f"HELM_{kind}_HOME": str(tmp_path / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")
    }
    env = {**os.environ, **homes, "KUBECACHEDIR": str(tmp_path / "kube-cache")}  # nothing in ~

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [binary, "template", "llm-serving", str(CHART), "--namespace", "default", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    return run


def by_identity(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """Documents by kind and name, a generated password masked (each render draws its own)."""
    return {
        (doc["kind"], doc["metadata"]["name"]): k8s_render.masked_password(doc)
        for doc in docs
        if doc
    }


@pytest.mark.parametrize("name", MATRIX)
def test_cli_renders_what_the_sdk_renders(helm, name: str) -> None:
    done = helm("-f", str(CI_DIR / f"{name}-values.yaml"))
    assert done.returncode == 0, done.stderr
    assert by_identity(list(yaml.safe_load_all(done.stdout))) == by_identity(rendered(name).docs)


def test_install_fails_where_kuberay_is_missing(helm, tmp_path: Path) -> None:
    with fake_cluster(tmp_path, with_kuberay=False) as kubeconfig:
        done = helm(
            "--kubeconfig", str(kubeconfig), "--dry-run=server", "--disable-openapi-validation"
        )
    assert done.returncode != 0
    assert "this cluster has no KubeRay CRDs (ray.io/v1 RayService)" in done.stderr


def test_install_passes_where_kuberay_runs(helm, tmp_path: Path) -> None:
    with fake_cluster(tmp_path, with_kuberay=True) as kubeconfig:
        done = helm(
            "--kubeconfig", str(kubeconfig), "--dry-run=server", "--disable-openapi-validation"
        )
    assert done.returncode == 0, done.stderr
    assert "kind: RayService" in done.stdout


def test_operator_check_can_be_turned_off(helm, tmp_path: Path) -> None:
    """Without the check, Helm itself stops at the RayService, with a less helpful message."""
    with fake_cluster(tmp_path, with_kuberay=False) as kubeconfig:
        done = helm(
            "--kubeconfig",
            str(kubeconfig),
            "--dry-run=server",
            "--disable-openapi-validation",
            "--set",
            "kuberay.checkOperator=false",
        )
    assert "VALUES VALIDATION" not in done.stderr
    assert 'no matches for kind "RayService" in version "ray.io/v1"' in done.stderr


def kinds_of(done: subprocess.CompletedProcess[str]) -> set[str]:
    return {doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc}


def test_servicemonitor_only_where_the_prometheus_operator_runs(helm) -> None:
    """The default install succeeds on a cluster without monitoring.coreos.com/v1."""
    without = helm("--api-versions", "ray.io/v1")
    assert without.returncode == 0, without.stderr
    assert "ServiceMonitor" not in kinds_of(without)
    assert "no ServiceMonitor/PodMonitor was created" in rendered("default").notes  # and why
    with_api = helm("--api-versions", "ray.io/v1", "--api-versions", "monitoring.coreos.com/v1")
    assert "ServiceMonitor" in kinds_of(with_api)


def test_install_without_prometheus_operator_passes(helm, tmp_path: Path) -> None:
    with fake_cluster(tmp_path, with_kuberay=True, with_monitoring=False) as kubeconfig:
        done = helm(
            "--kubeconfig", str(kubeconfig), "--dry-run=server", "--disable-openapi-validation"
        )
    assert done.returncode == 0, done.stderr
    assert "ServiceMonitor" not in kinds_of(done)


def test_kuberay_check_runs_for_a_namespace_not_created_yet(helm, tmp_path: Path) -> None:
    """--create-namespace: the release namespace does not exist when the chart renders."""
    with fake_cluster(tmp_path, with_kuberay=False) as kubeconfig:
        done = helm(
            "--kubeconfig",
            str(kubeconfig),
            "--dry-run=server",
            "--disable-openapi-validation",
            "--namespace",
            "not-created-yet",
        )
    assert done.returncode != 0
    assert "this cluster has no KubeRay CRDs (ray.io/v1 RayService)" in done.stderr


def test_an_existing_read_write_once_claim_is_looked_up_and_refused(helm, tmp_path: Path) -> None:
    """Offline renders cannot see an existing claim; an install reads its access modes."""
    claim = ["--set", "model.cache.persistentVolumeClaim.enabled=true"]
    claim += ["--set", "model.cache.persistentVolumeClaim.existingClaim=models"]
    for modes, refused in ((["ReadWriteOnce"], True), (["ReadWriteMany"], False)):
        with fake_cluster(tmp_path, with_kuberay=True, claims={"models": modes}) as kubeconfig:
            done = helm(
                "--kubeconfig",
                str(kubeconfig),
                "--dry-run=server",
                "--disable-openapi-validation",
                *claim,
            )
        assert (done.returncode != 0) is refused, done.stderr
        assert ("(of claim models) lets one node mount" in done.stderr) is refused


def test_an_upgrade_keeps_the_generated_password(helm, tmp_path: Path) -> None:
    """Offline renders draw a password; an install against a cluster reads the live Secret's."""
    live = {"password": base64.b64encode(b"kept-password").decode()}
    with fake_cluster(tmp_path, with_kuberay=True, secrets={"llm-serving-state": live}) as config:
        done = helm("--kubeconfig", str(config), "--dry-run=server", "--disable-openapi-validation")
    assert done.returncode == 0, done.stderr
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["data"] == live
    fresh = k8s_render.render_templates({})["llm-serving/templates/state.yaml"]
    fresh = yaml.safe_load(fresh.split("---")[0])["data"]["password"]
    assert len(base64.b64decode(fresh)) == 32 and fresh != live["password"]

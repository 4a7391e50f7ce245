"""checkov on the rendered matrix, with Ray pods scanned as Pods (checkov skips the RayService CRD).
Accepted findings live in k8s/checkov-skips.yaml, each with its reason; anything else fails."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.conftest import MATRIX, pod_documents, rendered, repo_path

SKIPS_FILE = repo_path("k8s", "checkov-skips.yaml")


def checkov_binary() -> str | None:
    """The Makefile installs checkov into its own venv (it pins packaging<24, unlike ray)."""
    candidates = [
        os.environ.get("CHECKOV"),
        str(repo_path(".venv", "tools", "checkov", "bin", "checkov")),
    ]
    found = [c for c in candidates if c and Path(c).is_file()]
    return found[0] if found else shutil.which("checkov")


def load_skips() -> list[dict[str, Any]]:
    skips = yaml.safe_load(SKIPS_FILE.read_text())
    for skip in skips:
        assert skip["reason"].strip() and "\n" not in skip["reason"].strip(), skip
    return skips


def is_skipped(finding: dict[str, Any], skip: dict[str, Any]) -> bool:
    return finding["check_id"] == skip["check"] and any(
        fnmatch.fnmatch(finding["resource"], pattern) for pattern in skip["resources"]
    )


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    binary = checkov_binary()
    if binary is None:
        pytest.skip("checkov is not installed: `make install` puts it in .venv/tools/checkov")
    folder = tmp_path_factory.mktemp("manifests")
    for name in MATRIX:
        docs = rendered(name).docs
        pods = [pod for doc in docs if doc["kind"] == "RayService" for pod in pod_documents(doc)]
        (folder / f"{name}.yaml").write_text(yaml.safe_dump_all(docs + pods))
    done = subprocess.run(
        [
            binary,
            "-d",
            str(folder),
            "--framework",
            "kubernetes",
            "--skip-download",
            "-o",
            "json",
            "--compact",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0
    return report["results"]["failed_checks"]


def test_no_unaccepted_findings(findings: list[dict[str, Any]]) -> None:
    skips = load_skips()
    open_findings = sorted(
        f"{f['check_id']} {f['resource']}: {f['check_name']}"
        for f in findings
        if not any(is_skipped(f, skip) for skip in skips)
    )
    assert open_findings == []


def test_every_skip_is_still_needed(findings: list[dict[str, Any]]) -> None:
    stale = [
        skip["check"] for skip in load_skips() if not any(is_skipped(f, skip) for f in findings)
    ]
    assert stale == []

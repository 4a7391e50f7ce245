"""`make lint` catches what it is for: an unused import, a type error and an import across the
package layers each fail it. Each check runs the project's own configuration (pyproject.toml) on
a copy of the packages with one mistake injected."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The packages and their lint configuration, copied."""
    for package in ("serving", "operators"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("data"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def run(tool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(cwd)}  # the copy, not the installed checkout
    return subprocess.run(
        [str(BIN / tool), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def inject(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_packages_pass_as_they_are(tree: Path) -> None:
    assert run("ruff", "check", "serving/config/apps.py", cwd=tree).returncode == 0
    assert run("mypy", "serving/config/apps.py", cwd=tree).returncode == 0
    assert run("lint-imports", cwd=tree).returncode == 0


def test_an_unused_import_fails(tree: Path) -> None:
    inject(tree / "serving" / "config" / "apps.py", "import os")
    result = run("ruff", "check", "serving/config/apps.py", cwd=tree)
    assert result.returncode != 0 and "F401" in result.stdout


def test_a_type_error_fails(tree: Path) -> None:
    inject(tree / "serving" / "config" / "apps.py", 'WRONG: int = "not a number"')
    result = run("mypy", "serving/config/apps.py", cwd=tree)
    assert result.returncode != 0 and "Incompatible types in assignment" in result.stdout


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("serving/engines/base.py", "import serving.api.errors"),
        ("serving/config/platform.py", "import serving.deployments"),
        ("serving/k8s/serve_config.py", "import operators.spec"),
    ],
)
def test_an_import_across_layers_fails(tree: Path, module: str, forbidden: str) -> None:
    inject(tree / module, forbidden)
    result = run("lint-imports", cwd=tree)
    assert result.returncode != 0 and "BROKEN" in result.stdout


SUPPRESSIONS = (
    re.compile(r"#\s*noqa(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<why>.*)$"),
    re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]+\])?(?P<why>.*)$"),
)


def unexplained_suppressions(text: str) -> list[str]:
    """`noqa` / `type: ignore` marks that name no code or give no reason after them."""
    found = []
    for line in text.splitlines():
        for pattern in SUPPRESSIONS:
            match = pattern.search(line)
            if match and not (match["codes"] and match["why"].strip(" -—:#()")):
                found.append(line.strip())
    return found


def test_suppressions_name_a_code_and_a_reason() -> None:
    assert unexplained_suppressions("x = 1  # noqa: F401 -- re-exported for tests") == []
    assert unexplained_suppressions("x = 1  # type: ignore[attr-defined]  # Ray adds it") == []
    assert unexplained_suppressions("x = 1  # noqa") != []
    assert unexplained_suppressions("x = 1  # type: ignore[misc]") != []
    files = [p for d in ("serving", "operators", "tests") for p in (REPO / d).rglob("*.py")]
    files.remove(Path(__file__))  # its examples above are unexplained on purpose
    found = {str(p.relative_to(REPO)): unexplained_suppressions(p.read_text()) for p in files}
    assert {path: lines for path, lines in found.items() if lines} == {}

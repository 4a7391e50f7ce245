"""The docs site builds with `mkdocs build --strict` (mkdocs.yml's validation settings make a broken
link, a missing anchor or a page outside the nav a warning, and --strict fails on any warning), and
every relative link and anchor of README.md resolves. No network."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serving.k8s import REPO_ROOT

README = REPO_ROOT / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """Lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        github_anchor(m[1]) for line in prose_lines(path.read_text()) if (m := HEADING.match(line))
    }


def relative_links(path: Path) -> list[str]:
    links = [target for line in prose_lines(path.read_text()) for target in LINK.findall(line)]
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def test_readme_relative_links_resolve() -> None:
    links = relative_links(README)
    assert links, "README.md has no relative links to check"
    for link in links:
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve() if target else README
        assert path.exists(), f"README.md links to {link}: {target} does not exist"
        if anchor:
            assert path.suffix == ".md", (
                f"README.md links to {link}: an anchor into a non-Markdown file"
            )
            assert anchor in anchors(path), (
                f"README.md links to {link}: no such heading in {target or 'README.md'}"
            )


def test_readme_is_short() -> None:
    """A README that gets you running; the rest lives in the docs site."""
    assert len(README.read_text().splitlines()) <= 200


def test_github_anchor_matches_github() -> None:
    assert github_anchor("vLLM's app behind the platform against `vllm serve`") == (
        "vllms-app-behind-the-platform-against-vllm-serve"
    )
    assert (
        github_anchor("Autoscaling, backpressure and metrics")
        == "autoscaling-backpressure-and-metrics"
    )


@pytest.mark.timeout(300)
def test_docs_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()

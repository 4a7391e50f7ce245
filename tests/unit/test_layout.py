"""The package layout stays a layout: no module imports another that imports it back (directly or
through others), and every third-party package the code imports is declared in pyproject.toml.
Both read the code as it is (grimp's import graph, the installed distributions)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("serving", "operators")
# Runs in Phoenix's own venv (`make install-tracing`), never in the platform's.
OWN_VENV = {Path("serving/tracing/phoenix_main.py")}


def circles(graph: grimp.ImportGraph) -> list[str]:
    """Each import a -> b where b also reaches a, with the chain back."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                found.append(f"{importer} -> {' -> '.join(back)}")
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    assert circles(grimp.build_graph(*PACKAGES)) == []


def test_a_circle_is_found() -> None:
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert circles(graph) == []
    graph.add_import(importer="p.c", imported="p.a")
    assert circles(graph) == [
        "p.a -> p.b -> p.c -> p.a",
        "p.b -> p.c -> p.a -> p.b",
        "p.c -> p.a -> p.b -> p.c",
    ]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [dep for deps in project["optional-dependencies"].values() for dep in deps]
    return {_normal(re.split(r"[\[<>=!~ ;]", dep)[0]) for dep in project["dependencies"] + extras}


def imported_top_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(PACKAGES)


def test_every_imported_package_is_declared() -> None:
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.relative_to(REPO) in OWN_VENV:
                continue
            for name in imported_top_names(path):
                if not {_normal(d) for d in providers.get(name, [name])} & declared:
                    undeclared.setdefault(name, str(path.relative_to(REPO)))
    assert undeclared == {}, "declare these in pyproject.toml (name: a file importing it)"

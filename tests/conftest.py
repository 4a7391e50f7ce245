"""Markers come from the folder a test lives in (tests/unit -> unit, tests/integration -> ...)."""

from __future__ import annotations

from pathlib import Path

import pytest

FOLDER_MARKERS = ("unit", "integration", "k8s")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in FOLDER_MARKERS:
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))

"""Markers come from the folder a test lives in (tests/unit -> unit, tests/integration -> ...);
every run records where its time went (tests/durations.py); under pytest-xdist (`make test`) the
integration tests share one worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.durations import Recorder
from tests.postgres import Postgres, running_postgres

FOLDER_MARKERS = ("unit", "integration", "k8s")
INTEGRATION = "tests/integration/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in FOLDER_MARKERS:
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Recorder(), "durations-recorder")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server on loopback for this session (started on first use, ~1 s)."""
    with running_postgres() as server:
        yield server


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One Ray cluster per machine: every integration test is one unit of work, run by one
    worker in the order tests/integration sets; the other tests go by module to any worker.
    (xdist's own `loadgroup` marks node ids, which pytest 9 no longer lets a plugin rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneRayCluster(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return INTEGRATION if nodeid.startswith(INTEGRATION) else super()._split_scope(nodeid)

    return OneRayCluster(config, log)

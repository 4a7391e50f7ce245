"""The suite's time record (tests/durations.py): grouped by kind and module, the slowest tests
first, and the docs' block rewritten in place, nothing else of the page touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import durations

RECORD = {
    "date": "2026-12-06",
    "wall_s": 30.0,
    "tests": {
        "tests/integration/test_fuzz.py::test_a[vllm]": {"setup": 9.0, "call": 5.0},
        "tests/integration/test_faults.py::test_b": {"call": 7.0, "teardown": 6.0},
        "tests/integration/test_vllm_api.py::test_c": {"call": 1.0},
        "tests/unit/test_soak.py::test_d": {"call": 0.5},
    },
}


def test_kinds_come_from_integration_modules_and_folders() -> None:
    rows = {name: (n, s) for name, n, s in durations.grouped(RECORD["tests"], durations.kind)}
    assert rows == {
        "fuzz": (1, 14.0),
        "fault": (1, 13.0),
        "integration": (1, 1.0),
        "unit": (1, 0.5),  # a unit module named like an integration one stays unit
    }


def test_slowest_and_fixture_starts() -> None:
    assert [s for _, s in durations.slowest(RECORD["tests"], 2)] == [14.0, 13.0]
    starts = durations.fixture_starts(RECORD["tests"])
    assert [(when, s) for _, when, s in starts] == [("setup", 9.0), ("teardown", 6.0)]


def test_docs_block_is_rewritten_in_place(tmp_path: Path) -> None:
    page = tmp_path / "development.md"
    page.write_text("intro\n<!-- slowest-tests:start -->\nold\n<!-- slowest-tests:end -->\nrest\n")
    durations.write_docs(RECORD, page)
    text = page.read_text()
    assert text.startswith("intro\n<!-- slowest-tests:start -->\nMeasured 2026-12-06")
    assert "old" not in text and text.endswith("<!-- slowest-tests:end -->\nrest\n")
    assert "| `tests/integration/test_fuzz.py::test_a[vllm]` | 14.0 |" in text


def test_a_page_without_the_block_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "development.md"
    page.write_text("no block\n")
    with pytest.raises(SystemExit, match="no slowest-tests block"):
        durations.write_docs(RECORD, page)

"""The one report writer every bench scenario goes through: the same files for each, the
scenario's name in result.json, its console lines, and the verdict the CLI turns into exit 3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from serving.loadgen.report import Report, output_dir, publish, write_report


def dot_plot(document: dict[str, Any], path: Path) -> Path:
    path.write_text(f"plot of {document['scenario']}")
    return path


def sample(passed: bool = True) -> Report:
    return Report(
        "toy",
        {"figure": 3},
        "# Toy\n",
        ["toy: figure 3"],
        {"toy.png": dot_plot},
        {"runs/a.json": {"x": 1}},
        passed,
    )


def test_the_writer_writes_the_same_files_for_every_scenario(tmp_path: Path) -> None:
    written = write_report(sample(), tmp_path / "out")
    assert [p.name for p in written] == ["result.json", "summary.md", "toy.png"]
    assert json.loads((tmp_path / "out/result.json").read_text()) == {
        "scenario": "toy",
        "figure": 3,
    }
    assert (tmp_path / "out/summary.md").read_text() == "# Toy\n"
    assert (tmp_path / "out/toy.png").read_text() == "plot of toy"  # plots see the scenario
    assert json.loads((tmp_path / "out/runs/a.json").read_text()) == {"x": 1}


def test_publish_prints_the_console_lines_and_the_verdict(tmp_path: Path) -> None:
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        outcomes: list[bool] = []
        result = runner.invoke(
            _command(lambda: outcomes.append(publish(sample(passed=False), Path("r"))))
        )
    assert result.exit_code == 0 and outcomes == [False]
    assert result.output.splitlines() == [
        "toy: figure 3",
        "report: r/summary.md (result.json, toy.png, runs/)",
    ]


def test_the_default_folder_names_the_scenario() -> None:
    assert output_dir(None, "soak").parent == Path("bench-results")
    assert output_dir(None, "soak").name.startswith("soak-")
    assert output_dir("given", "soak") == Path("given")


def _command(body: Any) -> Any:
    import click

    return click.command()(lambda: body())

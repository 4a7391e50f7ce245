"""The one report writer of `llm-serving bench`: every scenario hands it a Report and it writes
the same files (result.json with the scenario's name, summary.md, the scenario's plots and extra
JSON files), prints the console lines and says where the report is."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

Plot = Callable[[dict[str, Any], Path], Path]


@dataclass
class Report:
    """What one scenario run produced; `passed` is False when a gate it checks missed."""

    scenario: str
    document: dict[str, Any]
    markdown: str
    console: list[str]
    plots: dict[str, Plot] = field(default_factory=dict)  # file name -> plot of the document
    files: dict[str, Any] = field(default_factory=dict)  # relative path -> JSON body
    passed: bool = True


def output_dir(given: str | None, scenario: str) -> Path:
    """--output, or bench-results/SCENARIO-DATE."""
    return Path(given or f"bench-results/{scenario}-{dt.datetime.now():%Y%m%d-%H%M%S}")


def write_report(report: Report, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "result.json", out / "summary.md"]
    document = {"scenario": report.scenario, **report.document}
    written[0].write_text(json.dumps(document, indent=2))
    written[1].write_text(report.markdown)
    for relative, body in report.files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body))
    written += [plot(document, out / name) for name, plot in report.plots.items()]
    return written


def publish(report: Report, out: Path) -> bool:
    """Write the report, print its console lines and where it is; whether every gate held."""
    write_report(report, out)
    for line in report.console:
        click.echo(line)
    folders = sorted({Path(p).parts[0] + "/" for p in report.files if len(Path(p).parts) > 1})
    extras = ["result.json", *report.plots, *folders]
    click.echo(f"report: {out}/summary.md ({', '.join(extras)})")
    return report.passed

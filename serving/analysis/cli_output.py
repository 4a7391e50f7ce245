"""How `llm-serving analyze` prints: JSON for programs, aligned rows and tables for people."""

from __future__ import annotations

import json
from typing import Any

import click


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def num(value: int | float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.4g}"


def echo_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        click.echo(f"{label:<{width}}  {value}")


def echo_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    for line in [headers, [("-" * w) for w in widths], *rows]:
        click.echo("  ".join(f"{str(c):<{w}}" for c, w in zip(line, widths)).rstrip())


def echo_attention_matrices(report: dict[str, Any]) -> None:
    labels = [repr(t)[1:-1][:10] for t in report["tokens"]]
    width = max(6, *(len(label) for label in labels))
    for layer in report["attention"]:
        for head in layer["heads"]:
            click.echo(f"\nlayer {layer['layer']} head {head['head']} (row = query, column = key)")
            click.echo(" " * width + " " + " ".join(f"{label:>{width}}" for label in labels))
            for label, row in zip(labels, head["weights"]):
                click.echo(f"{label:>{width}} " + " ".join(f"{w:>{width}.3f}" for w in row))

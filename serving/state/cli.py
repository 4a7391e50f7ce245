"""`llm-serving usage`: the usage ledger (per day, tenant, model and adapter) read from the store
the config names (the local platform's by default), as a table or JSON."""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from serving.config import ConfigError, load_config
from serving.state.ledger import COUNTS
from serving.state.store import Store

COLUMNS = ("day", "tenant", "model", "adapter", *COUNTS)


def since_day(value: str | None) -> str | None:
    """A day (YYYY-MM-DD), or N days back (`7d`)."""
    if value is None:
        return None
    if value.endswith("d") and value[:-1].isdigit():
        return (dt.datetime.now(dt.UTC) - dt.timedelta(days=int(value[:-1]))).strftime("%Y-%m-%d")
    try:
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise click.BadParameter("a day (YYYY-MM-DD) or a number of days back (7d)") from None


def table(rows: list[dict]) -> str:
    cells = [COLUMNS] + [tuple(str(row[c] or "-") for c in COLUMNS) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


@click.command()
@click.option("--config", "config_path", help="Platform config whose store to read (its state).")
@click.option("--tenant", help="Only this tenant's rows.")
@click.option("--since", help="From this day (YYYY-MM-DD) or N days back (7d); default: all.")
@click.option("--json", "as_json", is_flag=True, help="JSON rows instead of a table.")
def usage(config_path: str | None, tenant: str | None, since: str | None, as_json: bool) -> None:
    """The usage ledger: per day (UTC), tenant, model and adapter, the engine requests served,
    their prompt, cached prompt and output tokens, errors and refusals."""
    try:
        state = load_config(config_path).state
    except ConfigError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    try:
        rows = Store(state).usage(tenant, since_day(since))
    except click.BadParameter:
        raise
    except Exception as err:  # the store cannot be reached: one line, not a traceback
        click.echo(f"error: cannot read the store ({type(err).__name__})", err=True)
        sys.exit(1)
    click.echo(json.dumps(rows, indent=2) if as_json else table(rows))

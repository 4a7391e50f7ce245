"""`llm-serving trace ID`: one request's spans as a timeline, read from Phoenix's API. Errors
(unknown id, backend down, no backend named) are one `error:` line and a non-zero exit."""

from __future__ import annotations

import sys

import click

from serving.config import ConfigError, load_config
from serving.tracing.backend import running_local
from serving.tracing.forensics import BAR_WIDTH, TraceNotFound, find_trace, format_timeline
from serving.tracing.phoenix import TraceBackendError, read_spans

DEFAULT_PROJECT = "llm-serving"


def backend_url(url: str | None, config_path: str | None) -> str:
    """--url, else the config's tracing.query_url, else the Phoenix `up --tracing` started."""
    if url:
        return url.rstrip("/")
    if config_path:
        query_url = load_config(config_path).tracing.query_url
        if query_url:
            return query_url
    running = running_local()
    if running is not None:
        return running.url
    raise ConfigError(
        "no trace backend: pass --url, or --config with tracing.query_url, or start the platform "
        "with `llm-serving up --tracing`"
    )


def project_name(project: str | None, config_path: str | None) -> str:
    if project:
        return project
    return load_config(config_path).tracing.project if config_path else DEFAULT_PROJECT


@click.command()
@click.argument("ident", metavar="ID")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Platform config YAML: its tracing.query_url and tracing.project.",
)
@click.option(
    "--url",
    help="Phoenix's base URL (default: the config's tracing.query_url, else the Phoenix "
    "`llm-serving up --tracing` started).",
)
@click.option("--project", help=f"Phoenix project (default: the config's, else {DEFAULT_PROJECT}).")
@click.option("--width", default=BAR_WIDTH, show_default=True, help="Characters of the time bars.")
def trace(
    ident: str, config_path: str | None, url: str | None, project: str | None, width: int
) -> None:
    """Print a request's spans as a timeline. ID: the response's `id` (chatcmpl-...), the
    client's X-Request-Id, or a 32-hex trace id."""
    try:
        base = backend_url(url, config_path)
        name = project_name(project, config_path)
        found = find_trace(read_spans, base, name, ident)
        spans = read_spans(base, name, trace_ids=[found.trace_id])
        if not spans:
            raise TraceNotFound(f"no trace {found.trace_id} in project '{name}' at {base}")
    except (ConfigError, TraceBackendError, TraceNotFound) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    for line in format_timeline(spans, max(10, width)):
        click.echo(line)
    if found.others:
        click.echo(
            f"{len(found.others)} older trace(s) carry this id too: {', '.join(found.others)}"
        )

"""`llm-serving render ...`: what the cluster gets, generated from PlatformConfig and the chart."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click
import yaml

from serving.config import ConfigError, load_config
from serving.k8s import CHART_DIR, REPO_ROOT
from serving.k8s.serve_config import InlineKeysError, serve_config_v2
from serving.k8s.values_schema import values_schema

SCHEMA_FILE = CHART_DIR / "values.schema.json"


def schema_text() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@click.group()
def render() -> None:
    """Generate files from their sources: serve config, chart values schema, manifests, docs reference."""


@render.command("serve-config")
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Platform config YAML."
)
def serve_config(config_path: str | None) -> None:
    """Print the RayService serveConfigV2 (Ray Serve's ServeDeploySchema) for a platform config."""
    try:
        document = serve_config_v2(load_config(config_path))
    except (ConfigError, InlineKeysError) as err:
        fail(str(err))
    click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)


@render.command("values-schema")
@click.option(
    "--output",
    "-o",
    default=str(SCHEMA_FILE),
    show_default=str(SCHEMA_FILE.relative_to(REPO_ROOT)),
    help="Where to write the chart's values.schema.json; '-' prints it.",
)
def values_schema_command(output: str) -> None:
    """Write the chart's values.schema.json (its `platform` part is PlatformConfig's schema)."""
    text = schema_text()
    if output == "-":
        click.echo(text, nl=False)
        return
    Path(output).write_text(text)
    click.echo(f"wrote {_shown(Path(output))}")


@render.command("chart-tables")
def chart_tables() -> None:
    """Regenerate the chart's templates/_generated.tpl (apps, routing policies) from Python."""
    from serving.k8s.templates import TEMPLATE_FILE, generated_template

    _write_files({TEMPLATE_FILE: generated_template()})


@render.command("docs")
def docs() -> None:
    """Regenerate docs/reference/ (platform config, chart values, CLI) from their sources."""
    from serving.reference_docs import reference_pages

    _write_files(reference_pages(click.get_current_context().find_root().command))


@render.command("upgrade-paths")
def upgrade_paths() -> None:
    """Regenerate the table of which path each value takes on `helm upgrade` (chart README, docs)
    (every value changed, the chart rendered before and after, classified as KubeRay and Serve
    decide)."""
    from serving.k8s.chart import RenderError
    from serving.k8s.upgrade_table import PAGES, page_with_table, upgrade_table

    try:
        table = upgrade_table()
    except RenderError as err:
        fail(f"the chart's defaults do not render: {err}")
    _write_files({page: page_with_table(page.read_text(), table, page) for page in PAGES})


@render.command("manifests")
def manifests() -> None:
    """Regenerate k8s/rendered/*.yaml and k8s/operator/operator.yaml from the chart (for kubectl
    users)."""
    from serving.k8s.chart import RenderError, rendered_manifests

    try:
        files = rendered_manifests()
    except RenderError as err:
        fail(str(err))
    _write_files(files)


def _write_files(files: dict[Path, str]) -> None:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        click.echo(f"wrote {_shown(path)}")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)

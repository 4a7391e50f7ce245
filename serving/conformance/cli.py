"""`llm-serving conformance`: the feature x target table for a set of OpenAI-compatible servers."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click

from serving.config import ConfigError, load_config
from serving.conformance.report import summary_line, superset_regressions, to_json, to_markdown
from serving.conformance.runner import (
    CASES,
    CaseResult,
    ConformanceError,
    parse_targets,
    run_target,
    served_model,
)
from serving.loadgen.peers import VLLM_PEER_NAME, PeerError, vllm_peer


def write_reports(output: Path, markdown: str, report: dict) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "conformance.md").write_text(markdown)
    (output / "conformance.json").write_text(json.dumps(report, indent=2) + "\n")


def check_base(base: str | None, names: list[str]) -> None:
    if base is not None and base not in names:
        raise ConformanceError(
            f"--require-superset {base!r} is not a target name ({', '.join(names)})"
        )


@contextlib.contextmanager
def with_vllm_peer(
    specs: tuple[str, ...], config_path: Path | None, output: Path | None
) -> Iterator[tuple[str, ...]]:
    """The targets, with plain vLLM's server first when a platform config names its options."""
    if config_path is None:
        yield specs
        return
    config = load_config(str(config_path))
    log = (output or Path(tempfile.mkdtemp(prefix="conformance-"))) / "vllm-peer.log"
    with vllm_peer(config, config.model.name, log) as peer:
        yield (f"{VLLM_PEER_NAME}={peer.base_url}", *specs)


def run_all(
    specs: tuple[str, ...],
    model: str | None,
    api_key: str,
    timeout: float,
    output: Path | None,
    base: str | None,
) -> int:
    targets = parse_targets(specs)
    check_base(base, [t.name for t in targets])
    # Listing the models first also turns an unreachable target into one error line.
    models = {t.name: served_model(t, api_key, timeout) for t in targets}
    if model:
        models = dict.fromkeys(models, model)
    results: list[CaseResult] = []
    for target in targets:
        started = time.monotonic()
        click.echo(f"{target.name}: {len(CASES)} cases on {models[target.name]} ...", err=True)
        results += run_target(target, models[target.name], api_key, timeout)
        click.echo(f"{target.name}: done in {time.monotonic() - started:.0f}s", err=True)
    names = [t.name for t in targets]
    markdown = to_markdown(results, names)
    click.echo(markdown + "\n" + summary_line(results, names))
    if output is not None:
        write_reports(output, markdown, to_json(results, targets, models))
    regressions = superset_regressions(results, base) if base else []
    if regressions:
        listed = "; ".join(f"{r.case} on {r.target} ({r.cell})" for r in regressions)
        click.echo(
            f"error: {len(regressions)} cases pass on {base} and not elsewhere: {listed}", err=True
        )
        return 1
    return 0


@click.command()
@click.option(
    "--target",
    "targets",
    multiple=True,
    required=True,
    metavar="NAME=URL",
    help="A server to test: a name for the table and its OpenAI base URL (ending in /v1).",
)
@click.option(
    "--model", help="Model to request; default: the first id of each target's /v1/models."
)
@click.option(
    "--api-key",
    default="unused",
    envvar="OPENAI_API_KEY",
    show_default=True,
    help="Bearer key sent to every target.",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for conformance.md and conformance.json.",
)
@click.option(
    "--require-superset",
    "base",
    metavar="NAME",
    help="Exit non-zero when a case that passes on target NAME does not pass on another.",
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds per request.")
@click.option(
    "--peer-vllm",
    "peer_config",
    metavar="CONFIG",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Also start plain vLLM's server (target vllm-serve, listed first) with this "
    "platform config's model and vllm serve options.",
)
def conformance(
    targets: tuple[str, ...],
    model: str | None,
    api_key: str,
    output: Path | None,
    base: str | None,
    timeout: float,
    peer_config: Path | None,
) -> None:
    """One case per OpenAI / vLLM API feature against each target: ok / fails / not offered."""
    try:
        with with_vllm_peer(targets, peer_config, output) as specs:
            code = run_all(specs, model, api_key, timeout, output, base)
    except (ConformanceError, ConfigError, PeerError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    sys.exit(code)

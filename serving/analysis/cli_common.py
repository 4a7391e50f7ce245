"""What the `llm-serving analyze` commands share: their error handling (one `error:` line and a
non-zero exit), model loading (quietly, weights or the architecture on the meta device), index
parsing and the click options, each defined once."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from serving.analysis import AnalysisInputError
from serving.config import ConfigError
from serving.models import ModelNotFoundError

EXIT_INPUT = 2


def analysis_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures print `error: ...` and exit non-zero instead of a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (AnalysisInputError, ConfigError) as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(EXIT_INPUT)
        except ModelNotFoundError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)

    return wrapper


def quiet_transformers() -> None:
    # Loading bars and advisory warnings would bury the tables.
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def architecture_model(model_ref: str, config_only: str | None):
    """Meta-device model from --config-only FILE, or from the model reference's config.json."""
    from serving.analysis.architecture import load_model_config, meta_model
    from serving.models import resolve_model

    quiet_transformers()
    source = Path(config_only) if config_only else resolve_model(model_ref) / "config.json"
    return meta_model(load_model_config(source))


def weights_model(model_ref: str, dtype: str):
    from serving.analysis.attention import load_analysis_model
    from serving.models import resolve_model

    quiet_transformers()
    return load_analysis_model(resolve_model(model_ref), dtype)


def parse_indices(text: str | None, name: str) -> list[int] | None:
    """'0,2,5' -> [0, 2, 5]; None stays None (every index)."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AnalysisInputError(f"--{name} takes comma-separated integers, got '{text}'") from None


model_option = click.option(
    "--model",
    "model_ref",
    default="default",
    show_default=True,
    help="Model reference: HF id, local dir, 'default' or 'tiny-qwen2'.",
)
config_only_option = click.option(
    "--config-only",
    type=click.Path(),
    help="A config.json: analyse the architecture without weights.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
dtype_option = click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="Weights dtype for the forward passes.",
)

"""The docs' reference pages are generated (`llm-serving render docs`) and checked in: a field of
PlatformConfig, a chart value or a CLI command that changed without regenerating fails here."""

from __future__ import annotations

from pathlib import Path
from typing import get_args, get_origin

from click.testing import CliRunner

from serving import reference_docs
from serving.cli import main
from serving.config import PlatformConfig

REGENERATE = "run `llm-serving render docs` (or `make render`)"


def test_reference_pages_are_up_to_date() -> None:
    for path, text in reference_docs.reference_pages(main).items():
        assert path.is_file() and path.read_text() == text, f"{path.name}: {REGENERATE}"


def test_config_page_lists_every_field() -> None:
    page = reference_docs.config_page()
    for section, field in PlatformConfig.model_fields.items():
        if get_origin(field.annotation) is list:  # `models`: its items' keys
            section, (item,) = f"{section}[]", get_args(field.annotation)
            assert f"| `{section}.adapters[].path` |" in page
        else:
            item = field.annotation
        for name in item.model_fields:
            assert f"| `{section}.{name}` |" in page


def test_cli_page_has_every_command() -> None:
    page = reference_docs.cli_page(main)
    for name in main.commands:
        assert f"## `llm-serving {name}`" in page


def test_render_docs_writes_the_pages(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(reference_docs, "REFERENCE_DIR", tmp_path)
    result = CliRunner().invoke(main, ["render", "docs"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart-values.md", "cli.md", "config.md"]

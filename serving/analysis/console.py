"""The analysis console (GET /analysis): one self-contained HTML page that draws what the JSON
routes answer (architecture card, module tree, KV-cache calculator, attention grid and head view,
generation trace). The page's own files and the vendored uPlot (serving/analysis/static, see its
LICENSES.md) are inlined, so it needs no network: the platform may run air-gapped."""

from __future__ import annotations

from functools import cache

from serving.analysis.page import script, static_text

TEMPLATE = "console.html"
STYLES = ("uplot-1.6.32.min.css", "console.css")
SCRIPTS = ("uplot-1.6.32.iife.min.js", "console.js")
# Placeholders in the template, each replaced once by the inlined files.
STYLES_SLOT = "<!-- styles -->"
SCRIPTS_SLOT = "<!-- scripts -->"


def style(source: str) -> str:
    if "</style" in source.lower():  # would end the inline element early
        raise ValueError("style source contains '</style'; it cannot be inlined")
    return f"<style>\n{source}\n</style>\n"


def fill_slot(template: str, slot: str, content: str) -> str:
    """The template with its one `slot` replaced; a template without it (or with two) is a bug."""
    if template.count(slot) != 1:
        raise ValueError(f"{TEMPLATE} must hold {slot} exactly once")
    return template.replace(slot, content)


def render_console(template: str, styles: list[str], scripts: list[str]) -> str:
    page = fill_slot(template, STYLES_SLOT, "".join(style(s) for s in styles))
    return fill_slot(page, SCRIPTS_SLOT, "".join(script(s) for s in scripts))


@cache
def console_page() -> str:
    """The page, built once per process: it holds no model data, only code."""
    return render_console(
        static_text(TEMPLATE),
        [static_text(name) for name in STYLES],
        [static_text(name) for name in SCRIPTS],
    )

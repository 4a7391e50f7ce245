"""Make bertviz's head view page self-contained: it loads require.js, d3 and jQuery from cdnjs,
which fails offline and in air-gapped clusters. The vendored copies (serving/analysis/static, see its
LICENSES.md) are inlined, so the page works from the route and when saved to a file alike."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

CDN = "https://cdnjs.cloudflare.com/ajax/libs"
# The tag bertviz puts before its fragment; replaced by the inlined scripts.
REQUIRE_TAG = f'<script src="{CDN}/require.js/2.3.6/require.min.js"></script>'
REQUIRE_FILE = "require-2.3.6.js"


@dataclass(frozen=True)
class AmdLibrary:
    module: str  # the name bertviz's script asks require.js for
    cdn_path: str  # its entry in bertviz's require.config paths
    file: str  # the vendored copy in serving/analysis/static
    global_name: str  # what the library sets on `window` when no AMD loader is present


LIBRARIES = (
    AmdLibrary("d3", f"{CDN}/d3/5.7.0/d3.min", "d3-5.7.0.min.js", "d3"),
    # bertviz asks for jQuery 2.0.0, which npm never had; 2.1.0 is the nearest (LICENSES.md).
    AmdLibrary("jquery", f"{CDN}/jquery/2.0.0/jquery.min", "jquery-2.1.0.min.js", "jQuery"),
)


@cache
def static_text(name: str) -> str:
    return resources.files("serving.analysis").joinpath("static", name).read_text("utf-8")


def script(source: str) -> str:
    if "</script" in source.lower():  # would end the inline element early
        raise ValueError("script source contains '</script'; it cannot be inlined")
    return f'<script type="text/javascript">\n{source}\n</script>\n'


def vendored_scripts() -> str:
    """The libraries as globals, then require.js, then AMD modules that hand out those globals.
    Loaded before require.js on purpose: d3's UMD wrapper calls an anonymous define() when it sees
    require.js, which an inline script cannot do ("Mismatched anonymous define() module")."""
    shims = "\n".join(
        f'define("{lib.module}", [], function () {{ return window.{lib.global_name}; }});'
        for lib in LIBRARIES
    )
    parts = [static_text(lib.file) for lib in LIBRARIES] + [static_text(REQUIRE_FILE), shims]
    return "".join(script(part) for part in parts)


def inline_vendored_scripts(fragment: str) -> str:
    """bertviz's fragment with its CDN scripts replaced by the vendored ones. Refuses a fragment
    that asks for other URLs (a bertviz upgrade) rather than serve a page that needs the network."""
    wanted = (REQUIRE_TAG, *(lib.cdn_path for lib in LIBRARIES))
    missing = [url for url in wanted if url not in fragment]
    if missing:
        raise RuntimeError(
            f"bertviz's head view no longer asks for {missing}; update serving/analysis/static "
            "and serving/analysis/page.py to the libraries it asks for now"
        )
    page = fragment.replace(REQUIRE_TAG, vendored_scripts())
    for lib in LIBRARIES:
        # The modules are defined before requirejs() runs, so these paths are never fetched;
        # pointing them at the module name removes the last remote reference from the page.
        page = page.replace(lib.cdn_path, lib.module)
    return page

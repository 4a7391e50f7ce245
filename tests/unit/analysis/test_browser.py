"""The attention head view opens in a real browser with no network: Debian's headless Chromium loads
the page the analysis route returns (over loopback HTTP, and saved to a file) and the DOM it
dumps must hold the prompt's tokens as the SVG <text> elements bertviz's script draws. If the
inlined require.js, d3 or jQuery did not run, the page has no <text> elements at all."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serving.analysis.attention import load_analysis_model
from serving.analysis.page import inline_vendored_scripts
from serving.config import AnalysisDeploymentConfig
from serving.deployments.analysis import build_analysis_api
from serving.models import resolve_model

PROMPT = "The capital of France is Paris"
CHROMIUM = "/usr/bin/chromium"
# Everything but loopback fails to resolve: the page must draw without any CDN.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


class SvgTextCollector(HTMLParser):
    """Text inside <text> elements, one string per element."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.inside = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "text":
            self.inside = True
            self.texts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self.inside = False

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.texts[-1] += data


def svg_texts(dom: str) -> list[str]:
    parser = SvgTextCollector()
    parser.feed(dom)
    return parser.texts


def dump_dom(url: str) -> str:
    """The DOM after the page's scripts ran (virtual time lets require.js's callbacks finish)."""
    browser = shutil.which("chromium") or CHROMIUM
    if not Path(browser).exists():
        pytest.fail("chromium is not installed; `make system-deps` installs Debian's package")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                OFFLINE,
                "--virtual-time-budget=10000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def page() -> tuple[str, list[str]]:
    """The HTML the analysis route returns for PROMPT, and the prompt's tokens (its JSON form)."""
    model, tokenizer = load_analysis_model(resolve_model("tiny-qwen2"), "float32")
    api = TestClient(build_analysis_api(model, tokenizer, AnalysisDeploymentConfig(), "tiny-qwen2"))
    html = api.post("/attention", params={"format": "html"}, json={"prompt": PROMPT})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    tokens = api.post("/attention", json={"prompt": PROMPT, "layers": [0], "heads": [0]})
    return html.text, tokens.json()["tokens"]


@pytest.fixture(scope="module")
def saved_page(page: tuple[str, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("head-view") / "view.html"
    path.write_text(page[0], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served_url(saved_page: Path) -> Iterator[str]:
    """The saved page over a loopback HTTP server, as a browser gets it from a route."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(saved_page.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/{saved_page.name}"
    finally:
        server.shutdown()
        server.server_close()


def test_page_has_no_remote_scripts(page: tuple[str, list[str]]) -> None:
    html = page[0]
    assert "cdnjs" not in html and "<script src=" not in html
    assert "RequireJS 2.3.6" in html and "d3js.org v5.7.0" in html and "jQuery v2.1.0" in html


def test_fragment_asking_for_other_libraries_is_refused() -> None:
    # A bertviz upgrade that asks for other versions must not silently yield a CDN-bound page.
    with pytest.raises(RuntimeError, match="update serving/analysis/static"):
        inline_vendored_scripts('<script src="https://cdnjs.cloudflare.com/ajax/libs/d3/7.0.0/d3">')


@pytest.mark.parametrize("where", ["http", "file"])
def test_headless_chromium_draws_the_prompt_tokens(
    where: str, page: tuple[str, list[str]], saved_page: Path, served_url: str
) -> None:
    url = served_url if where == "http" else saved_page.as_uri()
    texts = svg_texts(dump_dom(url))
    tokens = page[1]
    assert len(tokens) >= 5
    # bertviz draws the tokens twice: the attending column (left) and the attended one (right).
    assert texts == tokens + tokens, texts

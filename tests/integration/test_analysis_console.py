"""The analysis console (GET /analysis) in headless Chromium against the running platform, checked
as a person would: the embedded default model (SmolLM2-135M) is served by one more analysis app
(with an API key, typed into the page) beside the test platform's; every number on the page is
compared with the model's config.json or with the JSON route the page reads. Screenshots of each
panel go to $LLM_SERVING_SCREENSHOTS (default: a pytest tmp dir); README's come from there."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.config import parse_config
from serving.deployments.analysis import build_analysis_app
from serving.models import resolve_model
from tests.integration.chromium import Page, chromium
from tests.integration.conftest import Platform, extra_app

PREFIX = "/default-analysis"
KEY = "sk-console-browser-test"
PROMPT = "The capital of France is Paris"
NEW_TOKENS = 32
# Long enough that re-reading it each step (no-cache) costs visibly more than one cached step.
TRACE_PROMPT = (
    "Paris is the capital and largest city of France. It is known for its museums, its cafes, "
    "the river Seine and its many bridges, the cathedral of Notre-Dame and the tower built by "
    "Gustave Eiffel for the world fair of 1889. Lyon, Marseille and Toulouse are other large "
    "French cities. The capital of France is"
)
QWEN = "qwen2.5-0.5b"


def digits(text: str) -> int:
    """The first number in a cell's text: '1,234 bytes (...)' -> 1234."""
    return int(re.search(r"[\d,]+", text).group().replace(",", ""))


@pytest.fixture(scope="module")
def default_config() -> dict:
    return json.loads((resolve_model("default") / "config.json").read_text())


@pytest.fixture(scope="module")
def console_url(platform: Platform) -> Iterator[str]:
    """The default model's analysis app, keys on, at PREFIX in the running platform."""
    config = parse_config(
        {
            "model": {"ref": "default", "max_model_len": 1024, "dtype": "float32"},
            "analysis": {"route_prefix": PREFIX, "auth": {"api_keys": [KEY]}},
        }
    )
    with extra_app("default-analysis", PREFIX, build_analysis_app(config)):
        yield f"{platform.url}{PREFIX}"


@pytest.fixture(scope="module")
def api(console_url: str) -> Iterator[httpx.Client]:
    """The routes the page reads, with the key: the answers the page must show."""
    with httpx.Client(
        base_url=console_url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}
    ) as client:
        yield client


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("LLM_SERVING_SCREENSHOTS")
    return Path(where) if where else tmp_path_factory.mktemp("console-screenshots")


@pytest.fixture(scope="module")
def keyless_message(console_url: str) -> Iterator[tuple[Page, str]]:
    """The page opened without its key (what it says then), then given the key in its field."""
    with chromium() as page:
        page.goto(console_url)
        said = page.wait_for(
            "(m => !m.hidden && m.textContent)(document.getElementById('page-message'))"
        )
        page.type_into("#api-key", KEY)
        page.evaluate("document.getElementById('api-key').dispatchEvent(new Event('change'))")
        page.wait_for("!!document.querySelector('#architecture [data-field=num_layers]')")
        page.wait_for("!!document.querySelector('#kv-cache [data-field=total_bytes]')")
        yield page, said


@pytest.fixture(scope="module")
def page(keyless_message: tuple[Page, str]) -> Page:
    return keyless_message[0]


def field(page: Page, panel: str, name: str) -> str:
    return page.evaluate(f"document.querySelector('#{panel} [data-field={name}]').textContent")


def message(page: Page, panel: str) -> str:
    return page.evaluate(f"document.querySelector('#{panel} .message').textContent")


def test_without_the_key_the_page_says_so(keyless_message: tuple[Page, str]) -> None:
    said = keyless_message[1]
    assert said.startswith("401: ") and "API key" in said


def test_architecture_card_shows_the_models_config(
    page: Page, default_config: dict, shots: Path
) -> None:
    expected = {
        "num_layers": default_config["num_hidden_layers"],
        "num_query_heads": default_config["num_attention_heads"],
        "num_kv_heads": default_config["num_key_value_heads"],
        "hidden_size": default_config["hidden_size"],
        "vocab_size": default_config["vocab_size"],
    }
    shown = {name: digits(field(page, "architecture", name)) for name in expected}
    assert shown == expected
    page.screenshot("#architecture", shots / "architecture.png")


def test_module_tree_expands(page: Page, api: httpx.Client, shots: Path) -> None:
    # checkVisibility: a closed <details> hides its content with content-visibility, which
    # leaves the boxes in place (getClientRects would still count them).
    visible = "(n => !!n && n.checkVisibility())(document.querySelector('[data-module=\"{}\"]'))"
    assert page.evaluate(visible.format("model")) and not page.evaluate(
        visible.format("model.layers")
    )
    for name in ("model", "model.layers", "model.layers.0", "model.layers.0.self_attn"):
        page.click(f'[data-module="{name}"] > summary')
    assert page.evaluate(visible.format("model.layers.0.self_attn.k_proj"))
    rows = {row["name"]: row for row in api.get("/modules").json()["modules"]}
    k_proj = rows["model.layers.0.self_attn.k_proj"]
    text = page.evaluate(
        "document.querySelector('[data-module=\"model.layers.0.self_attn.k_proj\"]').textContent"
    )
    assert (
        "x".join(map(str, k_proj["weights"]["weight"])) in text
        and f"{k_proj['parameters']:,}" in text
    )
    page.screenshot("#modules", shots / "modules.png")


def kv_shown(page: Page) -> tuple[int, int]:
    return digits(field(page, "kv-cache", "bytes_per_token")), digits(
        field(page, "kv-cache", "total_bytes")
    )


def test_kv_calculator_follows_the_token_count(page: Page, api: httpx.Client, shots: Path) -> None:
    before = kv_shown(page)
    page.type_into("#kv-cache input[name=tokens]", "4096")
    page.wait_for(
        f"!document.querySelector('#kv-cache [data-field=total_bytes]')"
        f".textContent.startsWith('{before[1]:,}')"
    )
    route = api.get(
        "/kv-cache", params={"tokens": 4096, "batch": 1, "dtype": "auto", "memory_gb": 1}
    ).json()
    assert kv_shown(page) == (route["bytes_per_token"], route["total_bytes"]) != before
    assert digits(field(page, "kv-cache", "tokens_fit")) == route["budget"]["tokens_fit"]
    page.screenshot("#kv-cache", shots / "kv-cache.png")


def test_kv_calculator_shows_the_routes_400(page: Page, api: httpx.Client) -> None:
    refused = api.get("/kv-cache", params={"tokens": 0}).json()["error"]["message"]
    page.type_into("#kv-cache input[name=tokens]", "0")
    page.wait_for("document.querySelector('#kv-cache .message').textContent.startsWith('400')")
    assert message(page, "kv-cache") == f"400: {refused}"
    page.type_into("#kv-cache input[name=tokens]", "2048")
    page.wait_for("document.querySelector('#kv-cache .message').hidden")


def test_attention_grid_and_head_view(
    page: Page, api: httpx.Client, default_config: dict, shots: Path
) -> None:
    page.type_into("#attention input[name=prompt]", PROMPT)
    page.click("#attention button")
    layers, heads = default_config["num_hidden_layers"], default_config["num_attention_heads"]
    cells = page.wait_for("document.querySelectorAll('#attention canvas.cell').length")
    assert cells == layers * heads
    drawn = page.evaluate(
        "[...document.querySelectorAll('#attention canvas.cell')]"
        ".map(c => `${c.dataset.layer}:${c.dataset.head}`)"
    )
    assert sorted(drawn) == sorted(
        f"{layer}:{head}" for layer in range(layers) for head in range(heads)
    )
    head_view_texts = (
        "(d => d && [...d.querySelectorAll('text')].map(t => t.textContent))"
        "(document.querySelector('#attention .head-view').contentDocument)"
    )
    texts = page.wait_for(f"(t => t && t.length && t)({head_view_texts})")
    tokens = api.post("/attention", json={"prompt": PROMPT, "layers": [0], "heads": [0]}).json()[
        "tokens"
    ]
    assert texts == tokens + tokens  # bertviz draws the tokens twice: attending and attended
    page.screenshot("#attention", shots / "attention.png")


def test_attention_shows_the_routes_400(page: Page, api: httpx.Client) -> None:
    long_prompt = "word " * 300
    refused = api.post("/attention", json={"prompt": long_prompt}).json()["error"]["message"]
    page.type_into("#attention input[name=prompt]", long_prompt)
    page.click("#attention button")
    page.wait_for("document.querySelector('#attention .message').textContent.startsWith('400')")
    assert message(page, "attention") == f"400: {refused}" and "max_prompt_tokens" in refused


def test_trace_chart_draws_both_modes(page: Page, shots: Path) -> None:
    page.type_into("#trace input[name=prompt]", TRACE_PROMPT)
    page.type_into("#trace input[name=max_new_tokens]", str(NEW_TOKENS))
    page.click("#trace button")
    page.wait_for("!!window.analysisConsole.charts.trace", timeout_s=300)
    chart = page.evaluate(
        "(u => ({labels: u.series.map(s => s.label), lengths: u.data.map(d => d.length),"
        " canvas: !!document.querySelector('#trace .chart canvas')}))"
        "(window.analysisConsole.charts.trace)"
    )
    assert chart["labels"][1:] == ["no-cache", "kv-cache"] and chart["canvas"]
    assert chart["lengths"] == [NEW_TOKENS] * 3  # positions, then one series per mode
    fits = page.evaluate("document.querySelector('#trace .fit').textContent")
    assert fits.count("ms per token of context") == 2
    page.screenshot("#trace", shots / "trace.png")


def test_trace_shows_the_routes_400(page: Page) -> None:
    page.type_into("#trace input[name=max_new_tokens]", "65")
    page.click("#trace button")
    page.wait_for("document.querySelector('#trace .message').textContent.startsWith('400')")
    assert "max_new_tokens=64" in message(page, "trace")


def test_config_only_architecture_in_the_page(page: Page) -> None:
    page.evaluate(
        f"(s => {{ s.value = '{QWEN}'; s.dispatchEvent(new Event('change')); }})"
        "(document.getElementById('source'))"
    )
    page.wait_for("document.getElementById('model-name').textContent === 'qwen2.5-0.5b'")
    page.wait_for(
        "/^12,288 /.test(document.querySelector('#kv-cache [data-field=bytes_per_token]')"
        "?.textContent)"
    )
    assert field(page, "architecture", "parameters") == "494,032,768"
    assert field(page, "architecture", "kv_cache_bytes_per_token").startswith(
        "12,288 bytes per token"
    )
    assert page.evaluate("document.querySelector('#attention button').disabled")
    assert "without weights" in message(page, "attention")


@pytest.mark.parametrize("path", ["/analysis", "/analysis/"])
def test_platform_serves_the_page_without_keys(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert "window.analysisConsole" in response.text


def test_platform_page_draws_the_served_model_without_a_key(platform: Platform) -> None:
    with chromium() as page:
        page.goto(f"{platform.url}/analysis")
        layers = page.wait_for(
            "document.querySelector('#architecture [data-field=num_layers]')?.textContent"
        )
        assert layers == "2" and page.evaluate("document.getElementById('page-message').hidden")


def test_platform_page_says_how_to_turn_tracing_on_in_the_requests_panel(
    platform: Platform,
) -> None:
    """The session platform runs without tracing: the requests view says so and how to change it,
    as information rather than as a failure."""
    with chromium() as page:
        page.goto(f"{platform.url}/analysis")
        said = page.wait_for(
            "(m => !m.hidden && m.textContent.startsWith('404') && m.textContent)"
            "(document.querySelector('#requests .message'))"
        )
        assert "tracing is off" in said and "llm-serving up --tracing" in said
        assert "busy" not in said  # not the hint for an overloaded replica
        assert page.evaluate("document.querySelector('#requests .message').className") == (
            "message info"
        )
        assert page.evaluate("document.querySelectorAll('#requests g.bar').length") == 0

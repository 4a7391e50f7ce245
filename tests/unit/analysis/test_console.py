"""The analysis console page (GET /analysis) as the app serves it: self-contained (no remote script,
style or font), open without a key while the data routes stay guarded, and the `arch` query that
brings `--config-only` to the routes the page reads. The page drawing in a browser is tested in
tests/integration/test_analysis_console.py."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from serving.analysis.attention import load_analysis_model
from serving.analysis.console import STYLES_SLOT, console_page, render_console
from serving.api.auth import KeyRing
from serving.config import AnalysisDeploymentConfig
from serving.deployments.analysis import build_analysis_api
from serving.models import resolve_model

KEY = "sk-console-test"
QWEN = "qwen2.5-0.5b"


@pytest.fixture(scope="module")
def tiny() -> tuple:
    return load_analysis_model(resolve_model("tiny-qwen2"), "float32")


def client(tiny: tuple, keys: KeyRing | None = None) -> TestClient:
    return TestClient(
        build_analysis_api(*tiny, AnalysisDeploymentConfig(), "tiny-qwen2", keys=keys)
    )


@pytest.fixture(scope="module")
def api(tiny: tuple) -> TestClient:
    return client(tiny)


def test_page_is_self_contained() -> None:
    page = console_page()
    assert page.startswith("<!DOCTYPE html>") and "<!-- scripts -->" not in page
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)  # nothing fetched
    assert "https://" not in page.replace("https://github.com/leeoniya/uPlot", "")
    assert "uPlot (v1.6.32)" in page and "window.analysisConsole" in page


def test_render_refuses_a_template_without_its_slot() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        render_console("<html></html>", [], [])


def test_render_refuses_a_style_that_would_end_early() -> None:
    with pytest.raises(ValueError, match="</style"):
        render_console(f"{STYLES_SLOT}<!-- scripts -->", ["a {} </style>"], [])


@pytest.mark.parametrize("path", ["/", ""])
def test_route_serves_the_page(api: TestClient, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert response.text == console_page()


def test_page_opens_without_a_key_but_data_needs_one(tiny: tuple) -> None:
    guarded = client(tiny, KeyRing.of([KEY]))
    assert guarded.get("/").status_code == 200
    assert guarded.get("/config").status_code == 401
    assert guarded.get("/config", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_architectures_lists_the_shipped_configs(api: TestClient) -> None:
    assert api.get("/architectures").json() == {"model": "tiny-qwen2", "shipped": [QWEN]}


def test_arch_analyses_qwen_without_weights(api: TestClient) -> None:
    body = api.get("/config", params={"arch": QWEN}).json()
    assert body["model"] == QWEN and body["parameters"]["total"] == 494_032_768
    assert body["kv_cache_bytes_per_token"] == 12_288
    kv = api.get("/kv-cache", params={"arch": QWEN, "tokens": 4096}).json()
    assert kv["bytes_per_token"] == 12_288 and kv["total_bytes"] == 12_288 * 4096
    names = [
        row["name"]
        for row in api.get("/modules", params={"arch": QWEN, "depth": 2}).json()["modules"]
    ]
    assert "model.layers" in names
    assert len(api.get("/attention-layers", params={"arch": QWEN}).json()["layers"]) == 24


def test_without_arch_the_served_model_answers(api: TestClient) -> None:
    assert api.get("/config").json()["architecture"]["num_layers"] == 2


@pytest.mark.parametrize("path", ["/config", "/modules", "/attention-layers", "/kv-cache"])
def test_unknown_arch_is_400_naming_the_choices(api: TestClient, path: str) -> None:
    response = api.get(path, params={"arch": "../../etc/passwd"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "arch" and f"allowed: {QWEN}" in error["message"]


@pytest.mark.parametrize("url", ["/analysis", "/analysis/"])
def test_prefix_with_or_without_slash_is_the_page(tiny: tuple, url: str) -> None:
    # Serve hands the app its route prefix as root_path; without the slash Starlette would 307.
    prefixed = TestClient(
        build_analysis_api(*tiny, AnalysisDeploymentConfig(), "tiny-qwen2", keys=KeyRing.of([KEY])),
        root_path="/analysis",
    )
    response = prefixed.get(url, follow_redirects=False)
    assert response.status_code == 200 and response.text == console_page()

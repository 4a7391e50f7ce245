"""API keys on every app of a real platform: with keys configured, a request without a valid key
gets 401 in OpenAI's shape on the vLLM, baseline and analysis apps (the analysis app with keys of
its own), while /health and the Prometheus endpoint stay open."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from serving.config import PlatformConfig, parse_config
from tests.integration.conftest import MODEL, Platform, extra_apps
from tests.integration.fuzzing import fuzz_app

PLATFORM_KEY = "sk-platform-test-key"
ANALYSIS_KEY = "sk-analysis-test-key"
FUZZ_EXAMPLES = 10  # cases per operation and mode sent without a key


def keyed_config(prefix: str) -> PlatformConfig:
    """The tiny model with platform keys, and other keys for the analysis app."""
    return parse_config(
        {
            "model": {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"},
            "vllm": {
                "route_prefix": f"{prefix}-vllm",
                "engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 8},
            },
            "hf": {"route_prefix": f"{prefix}-hf"},
            "analysis": {
                "route_prefix": f"{prefix}-analysis",
                "auth": {"api_keys": [ANALYSIS_KEY], "api_keys_env": None},
            },
            "auth": {"api_keys": [PLATFORM_KEY]},
        }
    )


def builders() -> dict[str, Callable]:
    from serving.deployments.analysis import build_analysis_app
    from serving.deployments.hf_baseline import build_hf_app
    from serving.deployments.vllm_server import build_vllm_app

    return {"vllm": build_vllm_app, "hf": build_hf_app, "analysis": build_analysis_app}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


def check_openai_app(http: httpx.Client, url: str) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    for headers in ({}, bearer("sk-wrong"), bearer(ANALYSIS_KEY)):
        assert_401(http.post(f"{url}/v1/completions", json=body, headers=headers))
        assert_401(http.get(f"{url}/v1/models", headers=headers))
    assert http.get(f"{url}/health").status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=PLATFORM_KEY, max_retries=0)
    assert (
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2).usage.completion_tokens
        == 2
    )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()


def check_analysis_app(http: httpx.Client, url: str) -> None:
    for headers in ({}, bearer("sk-wrong"), bearer(PLATFORM_KEY)):  # its own key only
        assert_401(http.get(f"{url}/config", headers=headers))
        assert_401(http.post(f"{url}/attention", json={"prompt": "Hi"}, headers=headers))
    assert http.get(f"{url}/health").status_code == 200
    assert http.get(f"{url}/config", headers=bearer(ANALYSIS_KEY)).status_code == 200


@pytest.fixture(scope="module")
def keyed(platform: Platform) -> Iterator[PlatformConfig]:
    """The three apps with keys, deployed once into the running platform for the module."""
    config = keyed_config("/auth")
    apps = [
        (f"auth-{app}", getattr(config, app).route_prefix, builders()[app](config))
        for app in builders()
    ]
    with extra_apps(apps):
        yield config


@pytest.mark.parametrize("app", ["vllm", "hf", "analysis"])
def test_every_app_needs_a_key_but_health_and_metrics_stay_open(
    platform: Platform, http: httpx.Client, keyed: PlatformConfig, app: str
) -> None:
    url = f"{platform.url}{getattr(keyed, app).route_prefix}"
    if app == "analysis":
        check_analysis_app(http, url)
    else:
        check_openai_app(http, url)
    assert httpx.get(platform.metrics_url, timeout=60).status_code == 200


def test_fuzzing_without_a_key_gets_only_401(platform: Platform, keyed: PlatformConfig) -> None:
    """Every generated request to a keyed app, valid or not, is refused before it is read."""
    report = fuzz_app(
        f"{platform.url}{keyed.hf.route_prefix}", FUZZ_EXAMPLES, schema_headers=bearer(PLATFORM_KEY)
    )
    print(f"fuzz hf without a key: {report.total} cases {dict(report.statuses)}")
    assert not report.problems
    assert report.statuses[401] == report.total - report.cases["GET /health"]

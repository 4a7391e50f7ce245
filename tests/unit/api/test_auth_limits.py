"""API keys and request limits on the OpenAI routes over a fake engine: who gets in, which
requests are refused, with what status and which config field the message names."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from serving.api.auth import KeyRing, configured_keys, route_path
from serving.api.routes import build_openai_app
from serving.config import PlatformConfig
from serving.config.access import AuthConfig, RequestLimits
from tests.unit.fake_engine import FakeEngine

KEY = "sk-test-0123456789"
COMPLETION = {"model": "fake-model", "prompt": "alpha beta", "max_tokens": 2}


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def assert_openai_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def guarded(engine: FakeEngine) -> TestClient:
    return TestClient(build_openai_app(engine, keys=KeyRing.of([KEY, "sk-other"])))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- keys -------------------------------------------------------------------------------------


def test_key_ring_accepts_only_its_keys() -> None:
    ring = KeyRing.of([f" {KEY} ", "", "sk-other", KEY])
    assert ring.enabled and len(ring.digests) == 2  # stripped, empty dropped, de-duplicated
    assert ring.accepts(KEY) and ring.accepts("sk-other")
    assert not ring.accepts(KEY[:-1]) and not ring.accepts("") and not ring.accepts(KEY + "x")
    assert not KeyRing.of([]).enabled


def test_keys_come_from_config_and_environment() -> None:
    auth = AuthConfig(api_keys=["from-config"], api_keys_env="MY_KEYS")
    ring = configured_keys(auth, {"MY_KEYS": "env-a, env-b,,"})
    assert all(ring.accepts(k) for k in ("from-config", "env-a", "env-b"))
    assert len(ring.digests) == 3
    assert not configured_keys(AuthConfig(api_keys_env=None), {"MY_KEYS": "env-a"}).enabled
    assert not configured_keys(AuthConfig(), {}).enabled  # no key anywhere: auth is off


def test_config_never_shows_keys_and_rejects_empty_ones() -> None:
    config = PlatformConfig(auth={"api_keys": [KEY]}, analysis={"auth": {"api_keys": ["sk-an"]}})
    assert KEY not in repr(config) and "sk-an" not in repr(config) and KEY not in str(config)
    with pytest.raises(ValidationError, match="empty keys"):
        AuthConfig(api_keys=[" "])


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("sk-wrong"),
        {"Authorization": KEY},
        {"Authorization": "Basic c2stdGVzdA=="},
        {"Authorization": "Bearer "},
    ],
    ids=["none", "wrong", "no-scheme", "basic", "empty"],
)
def test_request_without_a_valid_key_is_401_openai_shaped(
    guarded: TestClient, engine: FakeEngine, headers: dict
) -> None:
    for method, path, body in [
        ("POST", "/v1/completions", COMPLETION),
        ("GET", "/v1/models", None),
        ("GET", "/openapi.json", None),
        ("GET", "/v1/nothing", None),
    ]:
        response = guarded.request(method, path, json=body, headers=headers)
        error = assert_openai_error(response, 401, "invalid_api_key")
        assert error["type"] == "invalid_request_error"
        assert response.headers["www-authenticate"] == "Bearer"
        assert "sk-wrong" not in response.text
    assert engine.started == []  # refused before any work


def test_valid_key_gets_through_every_route(guarded: TestClient) -> None:
    for key in (KEY, "sk-other"):
        assert (
            guarded.post("/v1/completions", json=COMPLETION, headers=bearer(key)).status_code == 200
        )
    assert guarded.get("/v1/models", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    stream = guarded.post(
        "/v1/completions", json={**COMPLETION, "stream": True}, headers=bearer(KEY)
    )
    assert sse_payloads(stream.text)[-1] == "[DONE]"


def test_health_needs_no_key(guarded: TestClient) -> None:
    assert guarded.get("/health").json()["status"] == "ok"


def test_no_keys_means_no_auth(engine: FakeEngine) -> None:
    client = TestClient(build_openai_app(engine, keys=KeyRing()))
    assert client.post("/v1/completions", json=COMPLETION).status_code == 200


def test_refused_keys_are_not_logged(guarded: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        guarded.post("/v1/completions", json=COMPLETION, headers=bearer("sk-leak-me"))
        guarded.post("/v1/completions", json=COMPLETION, headers=bearer(KEY))
    assert "sk-leak-me" not in caplog.text and KEY not in caplog.text


def test_route_path_strips_serves_route_prefix() -> None:
    assert route_path({"path": "/hf/health", "root_path": "/hf"}) == "/health"
    assert route_path({"path": "/health", "root_path": "/hf"}) == "/health"
    assert route_path({"path": "/analysis", "root_path": "/analysis"}) == "/"


# --- limits -----------------------------------------------------------------------------------


def limited(engine: FakeEngine, **limits) -> TestClient:
    return TestClient(build_openai_app(engine, limits=RequestLimits(**limits)))


def test_body_over_the_limit_is_413(engine: FakeEngine) -> None:
    client = limited(engine, max_body_bytes=200)
    big = {**COMPLETION, "prompt": "alpha " * 50}
    error = assert_openai_error(client.post("/v1/completions", json=big), 413, "request_too_large")
    assert "limits.max_body_bytes=200" in error["message"]
    # A chunked body (no Content-Length) is counted as it arrives.
    chunks = iter([json.dumps(big).encode()[:150], json.dumps(big).encode()[150:]])
    chunked = client.post(
        "/v1/completions", content=chunks, headers={"content-type": "application/json"}
    )
    assert_openai_error(chunked, 413, "request_too_large")
    assert engine.started == []
    small = iter([json.dumps(COMPLETION).encode()])
    ok = client.post("/v1/completions", content=small, headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text


def test_prompt_over_max_prompt_tokens_is_400(engine: FakeEngine) -> None:
    client = limited(engine, max_prompt_tokens=3)
    long = {**COMPLETION, "prompt": "alpha beta gamma delta"}
    error = assert_openai_error(client.post("/v1/completions", json=long), 400, "prompt_too_long")
    assert "limits.max_prompt_tokens=3" in error["message"] and error["param"] == "prompt"
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "alpha beta"}]}
    error = assert_openai_error(
        client.post("/v1/chat/completions", json=chat), 400, "prompt_too_long"
    )
    assert error["param"] == "messages"  # the template adds role tokens: 5 > 3
    assert (
        client.post(
            "/v1/completions", json={**COMPLETION, "prompt": "alpha beta gamma"}
        ).status_code
        == 200
    )


def test_max_tokens_over_the_cap_is_400_and_the_default_is_capped(engine: FakeEngine) -> None:
    client = limited(engine, max_tokens=4)
    error = assert_openai_error(
        client.post("/v1/completions", json={**COMPLETION, "max_tokens": 5}),
        400,
        "max_tokens_too_large",
    )
    assert "limits.max_tokens=4" in error["message"] and error["param"] == "max_tokens"
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    assert_openai_error(
        client.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 9}),
        400,
        "max_tokens_too_large",
    )
    # No max_tokens: completions' default 16 and chat's "rest of the context" both become 4.
    unset = client.post("/v1/completions", json={"model": "fake-model", "prompt": "alpha"}).json()
    assert unset["usage"]["completion_tokens"] == 4
    assert client.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] == 4


def test_request_over_the_timeout_is_408_and_aborted() -> None:
    engine = FakeEngine(delay_s=0.05)
    client = limited(engine, request_timeout_s=0.2)
    slow = {**COMPLETION, "max_tokens": 60}  # 3 s of work against a 0.2 s limit
    error = assert_openai_error(client.post("/v1/completions", json=slow), 408, "request_timeout")
    assert "limits.request_timeout_s=0.2" in error["message"]
    assert engine.aborted == engine.started and engine.running == 0


def test_stream_over_the_timeout_ends_with_an_error_event() -> None:
    engine = FakeEngine(delay_s=0.05)
    client = limited(engine, request_timeout_s=0.2)
    chat = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 60,
        "stream": True,
    }
    events = sse_payloads(client.post("/v1/chat/completions", json=chat).text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "request_timeout" and "limits.request_timeout_s" in error["message"]
    assert engine.aborted == engine.started and engine.running == 0


def test_n_over_max_n_is_400_naming_the_limit(engine: FakeEngine) -> None:
    client = limited(engine)  # the default cap: 16
    error = assert_openai_error(
        client.post("/v1/completions", json={**COMPLETION, "n": 17}), 400, "n_too_large"
    )
    assert "limits.max_n=16" in error["message"] and error["param"] == "n"
    assert engine.started == []
    raised = limited(engine, max_n=20)  # one source: the route takes the configured cap
    assert len(raised.post("/v1/completions", json={**COMPLETION, "n": 20}).json()["choices"]) == 20


def test_prompts_over_max_prompts_per_request_is_400(engine: FakeEngine) -> None:
    client = limited(engine, max_prompts_per_request=3)
    batch = {**COMPLETION, "prompt": ["alpha"] * 4}
    error = assert_openai_error(client.post("/v1/completions", json=batch), 400, "too_many_prompts")
    assert "limits.max_prompts_per_request=3" in error["message"] and error["param"] == "prompt"
    tokens = {**COMPLETION, "prompt": [[1, 2]] * 4}
    assert_openai_error(client.post("/v1/completions", json=tokens), 400, "too_many_prompts")
    assert engine.started == []
    three = client.post("/v1/completions", json={**COMPLETION, "prompt": ["alpha"] * 3})
    assert len(three.json()["choices"]) == 3


def test_requests_within_limits_are_untouched(engine: FakeEngine) -> None:
    client = limited(
        engine, max_body_bytes=10_000, max_prompt_tokens=8, max_tokens=8, request_timeout_s=30
    )
    body = client.post("/v1/completions", json={**COMPLETION, "max_tokens": 8}).json()
    assert body["usage"]["completion_tokens"] == 8


def test_analysis_app_takes_its_keys_and_the_body_limit() -> None:
    from serving.analysis.attention import load_analysis_model
    from serving.config import AnalysisDeploymentConfig
    from serving.deployments.analysis import build_analysis_api
    from serving.models import resolve_model

    model, tokenizer = load_analysis_model(resolve_model("tiny-qwen2"), "float32")
    app = build_analysis_api(
        model,
        tokenizer,
        AnalysisDeploymentConfig(),
        "tiny-qwen2",
        keys=KeyRing.of(["sk-analysis"]),
        max_body_bytes=300,
    )
    client = TestClient(app)
    assert client.get("/health").status_code == 200
    assert_openai_error(client.get("/config"), 401, "invalid_api_key")
    assert_openai_error(client.get("/config", headers=bearer(KEY)), 401, "invalid_api_key")
    assert client.get("/config", headers=bearer("sk-analysis")).status_code == 200
    big = {"prompt": "a " * 200}
    response = client.post("/attention", json=big, headers=bearer("sk-analysis"))
    assert "limits.max_body_bytes=300" in assert_openai_error(response, 413)["message"]


# --- found by fuzzing (tests/integration/test_fuzz.py): each was a 500 ----------------------


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/completions", {**COMPLETION, "seed": 2**64}, "seed"),
        ("/v1/completions", {**COMPLETION, "seed": -(2**63) - 1}, "seed"),
        (
            "/v1/completions",
            {**COMPLETION, "prompt": "hi \ud800"},
            "prompt: text must be valid Unicode",
        ),
        ("/v1/completions", {**COMPLETION, "stop": ["x", "\udc00"]}, "stop.1"),
        (
            "/v1/chat/completions",
            {"model": "fake-model", "messages": [{"role": "user", "content": "\ud800"}]},
            "messages.0.content",
        ),
    ],
    ids=[
        "seed-over-int64",
        "seed-under-int64",
        "surrogate-prompt",
        "surrogate-stop",
        "surrogate-chat",
    ],
)
def test_values_engines_cannot_take_are_400(
    engine: FakeEngine, path: str, body: dict, needle: str
) -> None:
    # json.dumps escapes a lone surrogate as JSON does ("\\ud800"); httpx would refuse to encode it.
    response = TestClient(build_openai_app(engine)).post(
        path, content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert needle in assert_openai_error(response, 400)["message"]
    assert engine.started == []


def test_empty_stop_strings_are_ignored(engine: FakeEngine) -> None:
    client = TestClient(build_openai_app(engine))
    for stop, text in (("", " gamma delta epsilon"), (["", "delta"], " gamma")):
        body = client.post(
            "/v1/completions", json={**COMPLETION, "max_tokens": 3, "stop": stop}
        ).json()
        assert body["choices"][0]["text"] == text


def test_hf_sampling_with_a_tiny_temperature_is_greedy() -> None:
    import torch

    from serving.engines.base import SamplingSpec
    from serving.engines.hf_rows import Row, choose_token

    logits = torch.tensor([0.0, 3.0, 1.0])
    for temperature in (1e-300, 1e-6):
        row = Row("r", [1], SamplingSpec(max_tokens=1, temperature=temperature), "generate", print)
        assert choose_token(logits, row, eos_ids=[]) == 1


def test_kv_cache_math_refuses_an_overflowing_memory_budget() -> None:
    from serving.analysis import AnalysisInputError
    from serving.analysis.kv_cache import kv_cache_report

    for memory_gb in (6.263173483979588e307, float("inf")):  # the fuzzed value, and inf
        with pytest.raises(AnalysisInputError, match="memory_gb must be at most") as err:
            kv_cache_report(2, 14, 2, 32, "float32", tokens=512, memory_gb=memory_gb)
        assert err.value.param == "memory_gb"
    assert kv_cache_report(2, 14, 2, 32, "float32", tokens=512, memory_gb=1e9)["budget"]

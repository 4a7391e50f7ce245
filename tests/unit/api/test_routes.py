"""The OpenAI routes over a fake engine: shapes, batching, streaming, errors, cancellation."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serving.api import generation as gen
from serving.api.routes import build_openai_app
from tests.unit.fake_engine import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> TestClient:
    return TestClient(build_openai_app(engine))


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_models_lists_the_served_model(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake-model"]
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    assert client.get("/v1/models/other").status_code == 404


def test_completion_counts_usage(client: TestClient) -> None:
    response = client.post(
        "/v1/completions", json={"model": "fake-model", "prompt": "alpha beta", "max_tokens": 3}
    )
    assert response.status_code == 200
    completion = Completion.model_validate(response.json())
    assert completion.choices[0].text == " gamma delta epsilon"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == 2
    assert completion.usage.completion_tokens == 3
    assert completion.usage.total_tokens == 5


def test_completion_default_max_tokens_is_16(client: TestClient) -> None:
    body = client.post("/v1/completions", json={"model": "fake-model", "prompt": "alpha"}).json()
    assert body["usage"]["completion_tokens"] == gen.COMPLETIONS_DEFAULT_MAX_TOKENS


def test_prompt_list_is_a_batch_with_n_choices_each(client: TestClient, engine: FakeEngine) -> None:
    body = client.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": ["alpha", "alpha beta"], "n": 2, "max_tokens": 2},
    ).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert len(engine.started) == 4
    assert body["usage"]["prompt_tokens"] == 1 + 2  # each prompt counted once, not once per choice
    assert body["usage"]["completion_tokens"] == 8


def test_stop_string_ends_with_stop(client: TestClient) -> None:
    body = client.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": "alpha", "max_tokens": 5, "stop": ["delta"]},
    ).json()
    assert body["choices"][0]["text"] == " beta gamma"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_chat_completion(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": "fake-model",
            "messages": [{"role": "user", "content": "alpha"}],
            "max_tokens": 2,
        },
    )
    chat = ChatCompletion.model_validate(response.json())
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content.split() == ["delta", "epsilon"]
    assert chat.usage.prompt_tokens == 3  # "user: alpha assistant:"


def test_chat_stream_sends_role_then_content_then_done(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": "fake-model",
            "messages": [{"role": "user", "content": "alpha"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(p)) for p in payloads[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["delta", "epsilon", "zeta"]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_completion_stream_carries_every_choice(client: TestClient) -> None:
    response = client.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": "alpha", "n": 2, "max_tokens": 2, "stream": True},
    )
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    indexes = {json.loads(p)["choices"][0]["index"] for p in payloads[:-1]}
    assert indexes == {0, 1}


def test_timings_extension_reaches_the_choice(client: TestClient) -> None:
    body = client.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": "alpha", "max_tokens": 2, "timings": True},
    ).json()
    assert body["choices"][0]["timings"] == {"ttft_ms": 1.0}


BAD_REQUESTS = [
    ("malformed json", "/v1/completions", b"{not json", 400, None),
    (
        "wrong type",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "max_tokens": "x"},
        400,
        "max_tokens",
    ),
    (
        "max_tokens zero",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "max_tokens": 0},
        400,
        "max_tokens",
    ),
    (
        "max_tokens negative",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "max_tokens": -5},
        400,
        "max_tokens",
    ),
    (
        "max_tokens above context",
        "/v1/completions",
        {"model": "fake-model", "prompt": "alpha", "max_tokens": 64},
        400,
        "max_tokens",
    ),
    (
        "prompt too long",
        "/v1/completions",
        {"model": "fake-model", "prompt": "alpha " * 70, "max_tokens": 1},
        400,
        "prompt",
    ),
    ("unknown model", "/v1/completions", {"model": "nope", "prompt": "a"}, 404, "model"),
    (
        "empty messages",
        "/v1/chat/completions",
        {"model": "fake-model", "messages": []},
        400,
        "messages",
    ),
    (
        "unknown field",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "bogus": 1},
        400,
        "bogus",
    ),
    (
        "unknown mode",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "mode": "warp"},
        400,
        "mode",
    ),
    (
        "temperature out of range",
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": "a"}], "temperature": 9},
        400,
        "temperature",
    ),
    (
        "top_k below -1",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "top_k": -2},
        400,
        "top_k",
    ),
    (
        "min_p above 1",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "min_p": 1.5},
        400,
        "min_p",
    ),
    (
        "repetition_penalty zero",
        "/v1/completions",
        {"model": "fake-model", "prompt": "a", "repetition_penalty": 0},
        400,
        "repetition_penalty",
    ),
    (
        "bad role",
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "wizard", "content": "a"}]},
        400,
        None,
    ),
    ("empty prompt list", "/v1/completions", {"model": "fake-model", "prompt": []}, 400, "prompt"),
    (
        "token id out of vocab",
        "/v1/completions",
        {"model": "fake-model", "prompt": [5, 100000]},
        400,
        "prompt",
    ),
]


@pytest.mark.parametrize(
    "name,path,body,status,param", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_input_gets_openai_error_and_server_keeps_serving(
    client: TestClient, name: str, path: str, body, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    ok = client.post(
        "/v1/completions", json={"model": "fake-model", "prompt": "a", "max_tokens": 1}
    )
    assert ok.status_code == 200


def test_unknown_route_is_openai_shaped_404(client: TestClient) -> None:
    response = client.get("/v1/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_health_reports_engine_queue(client: TestClient) -> None:
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["running"] == 0 and body["model"] == "fake-model"


async def test_leaving_a_stream_early_aborts_every_engine_request() -> None:
    engine = FakeEngine(delay_s=0.01)
    jobs = gen.plan_jobs(
        "req",
        gen.CompletionRequest(model="fake-model", prompt="alpha", n=3, max_tokens=50),
        [[1]],
        50,
        None,
        engine.max_model_len,
    )
    stream = gen.stream_jobs(engine, jobs)
    await anext(stream)
    await stream.aclose()
    await asyncio.sleep(0)
    assert sorted(engine.aborted) == ["req-0", "req-1", "req-2"]
    assert engine.running == 0

"""Logprobs and echo through the OpenAI routes over a fake engine, in vLLM's shapes: legacy
completions logprobs (tokens, token_logprobs, top_logprobs, text_offset), echo with prompt
logprobs, chat logprobs, streamed and not; and the requests vLLM's own benchmark client sends."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion

from serving.api.logprobs import LOGPROB_FLOOR, clamp, ranked
from serving.api.routes import build_openai_app
from serving.engines.base import TokenLogprob
from tests.unit.fake_engine import FakeEngine
from tests.unit.loopback import serve_on_loopback

MODEL = "fake-model"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> TestClient:
    return TestClient(build_openai_app(engine))


def sse_payloads(text: str) -> list[dict]:
    lines = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def complete(client: TestClient, **body) -> dict:
    response = client.post("/v1/completions", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_ranked_puts_the_chosen_token_first_once() -> None:
    entry = TokenLogprob(7, -2.0, ((3, -0.5), (7, -2.0), (9, -3.0)))
    assert ranked(entry) == [(7, -2.0), (3, -0.5), (9, -3.0)]
    assert clamp(float("-inf")) == LOGPROB_FLOOR


def test_completion_logprobs_have_the_legacy_shape(client: TestClient) -> None:
    body = complete(client, prompt="alpha beta", max_tokens=3, logprobs=2)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [" gamma", " delta", " epsilon"]
    assert logprobs["token_logprobs"] == pytest.approx([-0.5, -0.6, -0.7])
    assert logprobs["text_offset"] == [0, 6, 12]
    # the chosen token plus the 2 most likely, chosen first (as vLLM orders them)
    assert list(logprobs["top_logprobs"][0]) == [" gamma", " <100>", " <101>"]
    Completion.model_validate(body)


def test_logprobs_zero_returns_the_chosen_token_only(client: TestClient) -> None:
    body = complete(client, prompt="alpha", max_tokens=2, logprobs=0)
    assert [list(top) for top in body["choices"][0]["logprobs"]["top_logprobs"]] == [
        [" beta"],
        [" gamma"],
    ]


def test_no_logprobs_unless_asked(client: TestClient, engine: FakeEngine) -> None:
    body = complete(client, prompt="alpha", max_tokens=2, logprobs=None)  # as vLLM's bench sends it
    assert body["choices"][0]["logprobs"] is None
    assert engine.sampled[-1].logprobs is None and engine.sampled[-1].prompt_logprobs is None


def test_echo_with_logprobs_scores_the_prompt(client: TestClient, engine: FakeEngine) -> None:
    """What lm-evaluation-harness' local-completions sends to score a continuation."""
    body = complete(client, prompt=[[1, 2, 3]], max_tokens=1, logprobs=1, echo=True, temperature=0)
    choice = body["choices"][0]
    assert choice["text"] == " alpha beta gamma delta"  # token prompts are decoded
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [" alpha", " beta", " gamma", " delta"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == pytest.approx([-0.6, -0.7, -0.5])
    assert logprobs["text_offset"] == [0, 6, 11, 17]
    assert engine.sampled[-1].prompt_logprobs == 1
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 1


def test_echo_without_logprobs_returns_the_prompt_text(
    client: TestClient, engine: FakeEngine
) -> None:
    body = complete(client, prompt="alpha beta", max_tokens=1, echo=True)
    assert body["choices"][0]["text"] == "alpha beta gamma"
    assert body["choices"][0]["logprobs"] is None
    assert engine.sampled[-1].prompt_logprobs is None


def test_streamed_echo_comes_once_and_offsets_continue(client: TestClient) -> None:
    response = client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "alpha beta",
            "max_tokens": 2,
            "logprobs": 1,
            "echo": True,
            "stream": True,
        },
    )
    chunks = [c["choices"][0] for c in sse_payloads(response.text) if c["choices"]]
    assert [c["text"] for c in chunks] == ["alpha beta gamma", " delta"]
    assert chunks[0]["logprobs"]["tokens"] == [" alpha", " beta", " gamma"]
    assert chunks[0]["logprobs"]["text_offset"] == [0, 6, 11]
    assert chunks[1]["logprobs"]["text_offset"] == [17]


def test_chat_logprobs_list_each_token_with_its_top(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "alpha"}],
            "max_tokens": 2,
            "logprobs": True,
            "top_logprobs": 2,
        },
    )
    completion = ChatCompletion.model_validate(response.json())
    content = completion.choices[0].logprobs.content
    assert [c.token for c in content] == [" delta", " epsilon"]
    assert content[0].bytes == list(b" delta") and content[0].logprob == pytest.approx(-0.5)
    # the first top_logprobs of vLLM's order: the chosen token, then the most likely
    assert [t.token for t in content[0].top_logprobs] == [" delta", " <100>"]


def test_streamed_chat_carries_logprobs_per_chunk(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "alpha"}],
            "max_tokens": 3,
            "logprobs": True,
            "stream": True,
        },
    )
    chunks = [c["choices"][0] for c in sse_payloads(response.text) if c["choices"]]
    tokens = [e["token"] for c in chunks if c["logprobs"] for e in c["logprobs"]["content"]]
    assert tokens == [" delta", " epsilon", " zeta"]
    assert all(e["top_logprobs"] == [] for c in chunks[1:] for e in c["logprobs"]["content"])


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "alpha", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "alpha", "logprobs": -1}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
            None,
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
    ],
)
def test_bad_logprobs_get_a_400(
    client: TestClient, path: str, body: dict, param: str | None
) -> None:
    response = client.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "logprobs" in error["message"]


def test_an_engine_without_logprobs_refuses_them() -> None:
    engine = FakeEngine()
    engine.supports_logprobs = False
    client = TestClient(build_openai_app(engine))
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": "a", "logprobs": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"
    assert engine.started == []


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_vllm_benchmark_client_requests_succeed(backend: str) -> None:
    """vLLM's own bench request functions, with every sampling field its CLI can add."""
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS, RequestFuncInput

    sampling = {
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "temperature": 0.7,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.1,
        "repetition_penalty": 1.1,
    }
    path = "completions" if backend == "openai" else "chat/completions"
    with serve_on_loopback(build_openai_app(FakeEngine())) as url:
        request = RequestFuncInput(
            prompt="alpha beta",
            api_url=f"{url}/v1/{path}",
            prompt_len=2,
            output_len=4,
            model=MODEL,
            ignore_eos=True,
            extra_body=sampling,
        )
        output = asyncio.run(_send(ASYNC_REQUEST_FUNCS[backend], request))
    assert output.success, output.error
    assert output.output_tokens == 4 and output.generated_text


async def _send(request_func, request):
    async with aiohttp.ClientSession() as session:
        return await request_func(request, session)

"""The vLLM app through real HTTP: official OpenAI client (sync, async, streaming), raw HTTP for
errors, and a client that leaves mid-stream. Real Ray Serve + real vLLM V1 on the tiny model."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.integration.conftest import Platform

GREEDY = {"temperature": 0.0}


def test_models_lists_the_served_model(platform: Platform) -> None:
    models = platform.client().models.list()
    assert [m.id for m in models.data] == [platform.model]


def test_health_reports_an_idle_engine(http: httpx.Client) -> None:
    body = http.get("/health").json()
    assert body["status"] == "ok"
    assert body["running"] == 0 and body["waiting"] == 0


def test_completion_respects_max_tokens_and_counts_usage(platform: Platform) -> None:
    completion = platform.client().completions.create(
        model=platform.model,
        prompt="The capital of France is",
        max_tokens=7,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 7
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 7
    assert completion.choices[0].text


def test_prompt_list_is_a_batch(platform: Platform) -> None:
    prompts = ["One, two,", "Red, green,", "Monday, Tuesday,"]
    completion = platform.client().completions.create(
        model=platform.model,
        prompt=prompts,
        max_tokens=4,
        n=2,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in completion.choices) == list(range(6))
    assert completion.usage.completion_tokens == 6 * 4


def test_greedy_is_deterministic_and_batch_equals_single(platform: Platform) -> None:
    client = platform.client()
    single = client.completions.create(model=platform.model, prompt="Hello", max_tokens=8, **GREEDY)
    batch = client.completions.create(
        model=platform.model, prompt=["Hello", "Goodbye"], max_tokens=8, **GREEDY
    )
    assert batch.choices[0].text == single.choices[0].text


def test_seed_makes_sampling_reproducible(platform: Platform) -> None:
    client = platform.client()
    args = dict(
        model=platform.model,
        prompt="Once upon a time",
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        extra_body={"ignore_eos": True},
    )
    first = client.completions.create(seed=7, **args).choices[0].text
    again = client.completions.create(seed=7, **args).choices[0].text
    other = client.completions.create(seed=8, **args).choices[0].text
    assert first == again
    assert first != other


@pytest.mark.parametrize("narrow", [{"top_k": 1}, {"min_p": 1.0}])
def test_vllm_sampling_extensions_narrow_to_the_greedy_token(platform: Platform, narrow) -> None:
    client = platform.client()
    args = dict(
        model=platform.model,
        prompt="Once upon a time",
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    greedy = client.completions.create(**args, **GREEDY).choices[0].text
    args["extra_body"] = {"ignore_eos": True, **narrow}
    sampled = {
        client.completions.create(**args, temperature=1.0, seed=s).choices[0].text for s in (1, 2)
    }
    assert sampled == {greedy}


def test_stop_string_cuts_the_text(platform: Platform) -> None:
    client = platform.client()
    args = dict(model=platform.model, prompt="Numbers:", max_tokens=12, **GREEDY)
    full = client.completions.create(**args).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    cut = client.completions.create(stop=[stop], **args).choices[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text
    assert full.startswith(cut.text)


def test_chat_completion_uses_the_chat_template(platform: Platform) -> None:
    client = platform.client()
    messages = [{"role": "user", "content": "Say hi"}]
    chat = client.chat.completions.create(model=platform.model, messages=messages, max_tokens=5)
    plain = client.completions.create(model=platform.model, prompt="Say hi", max_tokens=5)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens > plain.usage.prompt_tokens  # template tokens were added


def test_chat_stream_matches_non_stream(platform: Platform) -> None:
    client = platform.client()
    args = dict(
        model=platform.model,
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=10,
        **GREEDY,
    )
    full = client.chat.completions.create(**args).choices[0].message.content
    stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **args
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 10
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finishes) == 1


def test_completion_stream(platform: Platform) -> None:
    stream = platform.client().completions.create(
        model=platform.model,
        prompt="Hello",
        max_tokens=6,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert len(chunks) >= 2
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_concurrent_requests_all_succeed(platform: Platform) -> None:
    client = platform.async_client()
    results = await asyncio.gather(
        *[
            client.completions.create(
                model=platform.model,
                prompt=f"Item {i}",
                max_tokens=16,
                extra_body={"ignore_eos": True},
            )
            for i in range(12)
        ]
    )
    assert all(r.usage.completion_tokens == 16 for r in results)


BAD = [
    ("malformed json", "/v1/chat/completions", b'{"model": ', 400),
    (
        "wrong type",
        "/v1/completions",
        {"model": "tiny-qwen2", "prompt": "a", "max_tokens": "many"},
        400,
    ),
    (
        "max_tokens zero",
        "/v1/completions",
        {"model": "tiny-qwen2", "prompt": "a", "max_tokens": 0},
        400,
    ),
    (
        "max_tokens above limit",
        "/v1/completions",
        {"model": "tiny-qwen2", "prompt": "a", "max_tokens": 5000},
        400,
    ),
    (
        "prompt too long",
        "/v1/completions",
        {"model": "tiny-qwen2", "prompt": "word " * 2000, "max_tokens": 1},
        400,
    ),
    (
        "unknown model",
        "/v1/chat/completions",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]},
        404,
    ),
    ("empty messages", "/v1/chat/completions", {"model": "tiny-qwen2", "messages": []}, 400),
    ("messages not a list", "/v1/chat/completions", {"model": "tiny-qwen2", "messages": "hi"}, 400),
    (
        "top_logprobs over max_logprobs",
        "/v1/chat/completions",
        {
            "model": "tiny-qwen2",
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "top_logprobs": 50,
        },
        400,
    ),
]


@pytest.mark.parametrize("name,path,body,status", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_and_the_replica_keeps_serving(
    http: httpx.Client, platform: Platform, name: str, path: str, body, status: int
) -> None:
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    after = platform.client().completions.create(model=platform.model, prompt="ok", max_tokens=2)
    assert after.usage.completion_tokens >= 1


def test_openai_client_raises_typed_errors(platform: Platform) -> None:
    client = platform.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=platform.model, prompt="a " * 2000, max_tokens=1)


def test_client_disconnect_aborts_the_engine_request(
    platform: Platform, http: httpx.Client
) -> None:
    before = http.get("/health").json()["aborted_total"]
    body = {
        "model": platform.model,
        "prompt": "Tell a long story",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=platform.url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        received = [line for _, line in zip(range(6), lines)]
        assert any(line.startswith("data: ") for line in received)
    health = {}
    deadline = time.monotonic() + 60  # bounded wait; the abort normally lands within a second
    while time.monotonic() < deadline:
        health = http.get("/health").json()
        if health["aborted_total"] > before and health["running"] == 0:
            break
        time.sleep(0.2)
    assert health["aborted_total"] == before + 1, health
    assert health["running"] == 0 and health["waiting"] == 0, health

"""The HF baseline is vLLM's paired baseline for logprobs too: in float32, greedy, the baseline
route (/hf/v1) and vLLM (the platform's /v1 route, and plain vLLM's own server on the same model)
give the same tokens with logprobs within 1e-3, in the same shapes: completions' legacy logprobs,
echo with prompt logprobs (what lm-evaluation-harness scores with), chat logprobs. Real HTTP,
the official openai client, real transformers and vLLM on the tiny model."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import Platform

TOLERANCE = 1e-3
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
VLLM_TARGETS = ("platform-vllm", "plain-vllm")


@pytest.fixture(scope="module")
def hf(platform: Platform) -> openai.OpenAI:
    return platform.client("/hf")


@pytest.fixture(scope="module", params=VLLM_TARGETS)
def vllm(request: pytest.FixtureRequest, platform: Platform) -> openai.OpenAI:
    """The platform's vLLM route, or plain vLLM's server (started only when asked for)."""
    if request.param == "platform-vllm":
        return platform.client()
    url = request.getfixturevalue("plain_vllm")
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def max_diff(a: list[float | None], b: list[float | None]) -> float:
    assert [x is None for x in a] == [x is None for x in b]
    return max((abs(x - y) for x, y in zip(a, b) if x is not None), default=0.0)


def assert_same_top(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    assert max_diff([a[k] for k in a], [b[k] for k in a]) < TOLERANCE


def test_greedy_completion_logprobs_agree(
    hf: openai.OpenAI, vllm: openai.OpenAI, platform: Platform
) -> None:
    request = {"model": platform.model, "prompt": PROMPTS, "max_tokens": 8, "logprobs": 3, **GREEDY}
    ours, theirs = hf.completions.create(**request), vllm.completions.create(**request)
    assert len(ours.choices) == len(theirs.choices) == len(PROMPTS)
    for a, b in zip(ours.choices, theirs.choices):
        assert a.text == b.text and a.logprobs.tokens == b.logprobs.tokens
        assert len(a.logprobs.tokens) == 8
        diff = max_diff(a.logprobs.token_logprobs, b.logprobs.token_logprobs)
        assert diff < TOLERANCE, f"max |logprob diff| {diff:.2e}"
        assert a.logprobs.text_offset == b.logprobs.text_offset
        for top_a, top_b in zip(a.logprobs.top_logprobs, b.logprobs.top_logprobs):
            assert_same_top(top_a, top_b)


def test_echo_returns_the_prompt_with_its_logprobs(
    hf: openai.OpenAI, vllm: openai.OpenAI, platform: Platform
) -> None:
    """What lm-evaluation-harness' local-completions sends to score loglikelihood."""
    request = {
        "model": platform.model,
        "prompt": PROMPTS[0],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        **GREEDY,
    }
    ours, theirs = hf.completions.create(**request), vllm.completions.create(**request)
    a, b = ours.choices[0], theirs.choices[0]
    assert a.text.startswith(PROMPTS[0]) and a.text == b.text
    assert a.logprobs.tokens == b.logprobs.tokens
    assert len(a.logprobs.tokens) == ours.usage.prompt_tokens + 1
    assert a.logprobs.token_logprobs[0] is None and a.logprobs.top_logprobs[0] is None
    diff = max_diff(a.logprobs.token_logprobs, b.logprobs.token_logprobs)
    assert diff < TOLERANCE, f"max |logprob diff| {diff:.2e}"
    for top_a, top_b in zip(a.logprobs.top_logprobs[1:], b.logprobs.top_logprobs[1:]):
        assert_same_top(top_a, top_b)


def test_greedy_chat_logprobs_agree(
    hf: openai.OpenAI, vllm: openai.OpenAI, platform: Platform
) -> None:
    request = {
        "model": platform.model,
        "max_tokens": 6,
        "logprobs": True,
        "top_logprobs": 3,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        **GREEDY,
    }
    ours = hf.chat.completions.create(**request).choices[0].logprobs.content
    theirs = vllm.chat.completions.create(**request).choices[0].logprobs.content
    assert [t.token for t in ours] == [t.token for t in theirs] and len(ours) == 6
    assert [t.bytes for t in ours] == [t.bytes for t in theirs]
    diff = max_diff([t.logprob for t in ours], [t.logprob for t in theirs])
    assert diff < TOLERANCE, f"max |logprob diff| {diff:.2e}"
    for a, b in zip(ours, theirs):
        assert_same_top(
            {t.token: t.logprob for t in a.top_logprobs},
            {t.token: t.logprob for t in b.top_logprobs},
        )


def test_streamed_logprobs_are_the_whole_ones(hf: openai.OpenAI, platform: Platform) -> None:
    chat = {
        "model": platform.model,
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "messages": [{"role": "user", "content": "Hello"}],
        **GREEDY,
    }
    whole = hf.chat.completions.create(**chat).choices[0].logprobs.content
    streamed = [
        entry
        for chunk in hf.chat.completions.create(**chat, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert streamed == whole
    echo = {
        "model": platform.model,
        "prompt": PROMPTS[1],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 3,
        **GREEDY,
    }
    whole_echo = hf.completions.create(**echo).choices[0]
    chunks = [c.choices[0] for c in hf.completions.create(**echo, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole_echo.text
    assert [t for c in chunks for t in c.logprobs.tokens] == whole_echo.logprobs.tokens
    assert [o for c in chunks for o in c.logprobs.text_offset] == whole_echo.logprobs.text_offset

"""The limits on what a request to vLLM's app asks for (checked in its body, before vLLM clamps
max_tokens or runs a beam search step by step) and the abort of its engine work when the request
ends early (deadline, client gone), over a stand-in app whose handlers use vLLM's own
`with_cancellation`. The real engine: tests/integration/test_vllm_limits.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from vllm.entrypoints.serve.utils.api_utils import with_cancellation

from serving.api.vllm_limits import prompt_count
from serving.api.vllm_wrap import wrap_vllm_app
from serving.config.access import RequestLimits


class StandInEngine:
    """What wrap_vllm_app reads of the engine; `llm.generate` runs until cancelled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.finished = asyncio.Event()
        self.llm = SimpleNamespace(generate=self._generate)

    def _generate(self, prompt: Any, params: Any, request_id: str, **kw: Any) -> AsyncIterator:
        async def outputs() -> AsyncIterator[str]:
            self.started.append(request_id)
            try:
                await asyncio.sleep(30)  # an engine request generating on
                yield "late"
            except (asyncio.CancelledError, GeneratorExit):
                self.cancelled.append(request_id)  # where AsyncLLM.generate aborts it
                raise
            finally:
                self.finished.set()

        return outputs()

    async def check_health(self) -> None:
        return None


def stand_in_vllm_app(engine: StandInEngine) -> FastAPI:
    """vLLM's route shape: a `with_cancellation` handler that reads the body, starts an engine
    request and collects it (a non-streaming answer)."""
    app = FastAPI()
    app.state.bodies = []

    async def generate_route(body: dict) -> dict:
        app.state.bodies.append(body)
        if body.get("slow"):
            async for _ in engine.llm.generate({"prompt_token_ids": [1]}, None, "req-1"):
                pass
        return {"ok": True}

    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"):

        @with_cancellation
        async def route(request: dict, raw_request: Request) -> dict:
            return await generate_route(request)

        app.add_api_route(path, route, methods=["POST"])
    return app


def wrapped(limits: RequestLimits) -> tuple[Any, FastAPI, StandInEngine]:
    engine = StandInEngine()
    app = stand_in_vllm_app(engine)
    return wrap_vllm_app(app, engine, None, limits, None), app, engine


async def post(app: Any, path: str, body: dict) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(path, json=body)


def assert_limit_error(response: httpx.Response, setting: str, param: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert setting in error["message"] and error["param"] == param


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/completions", "max_tokens"),
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/chat/completions", "max_completion_tokens"),
        ("/v1/responses", "max_output_tokens"),
    ],
)
async def test_max_tokens_over_the_limit_is_400_before_vllm_clamps_it(
    path: str, field: str
) -> None:
    app, inner, _ = wrapped(RequestLimits(max_tokens=16))
    response = await post(app, path, {**CHAT, field: 400})
    assert_limit_error(response, "limits.max_tokens=16", field)
    assert inner.state.bodies == []  # vLLM's app never saw it
    assert (await post(app, path, {**CHAT, field: 16})).status_code == 200


async def test_beam_search_is_held_to_max_tokens_and_max_n() -> None:
    app, inner, _ = wrapped(RequestLimits(max_tokens=16, max_n=4))
    beam = {**CHAT, "use_beam_search": True, "n": 2}
    assert_limit_error(
        await post(app, "/v1/chat/completions", {**beam, "max_tokens": 17}),
        "limits.max_tokens=16",
        "max_tokens",
    )
    assert_limit_error(
        await post(app, "/v1/completions", {**beam, "prompt": "a", "n": 5}), "limits.max_n=4", "n"
    )
    assert (await post(app, "/v1/chat/completions", {**beam, "max_tokens": 16})).status_code == 200


async def test_n_and_best_of_over_max_n_are_400() -> None:
    app, inner, _ = wrapped(RequestLimits())  # default max_n: 16
    assert_limit_error(
        await post(app, "/v1/completions", {"model": "m", "prompt": "a", "n": 1000}),
        "limits.max_n=16",
        "n",
    )
    assert_limit_error(
        await post(app, "/v1/chat/completions", {**CHAT, "best_of": 17}),
        "limits.max_n=16",
        "best_of",
    )
    nested = {"token_ids": [1], "sampling_params": {"n": 17}}  # vLLM's /inference/v1/generate
    assert_limit_error(
        await post(app, "/v1/completions", nested), "limits.max_n=16", "sampling_params.n"
    )
    assert inner.state.bodies == []
    assert (await post(app, "/v1/completions", {"model": "m", "prompt": "a", "n": 16})).is_success


async def test_prompts_over_max_prompts_per_request_are_400() -> None:
    app, inner, _ = wrapped(RequestLimits(max_prompts_per_request=2))
    three = {"model": "m", "prompt": ["a", "b", "c"]}
    assert_limit_error(
        await post(app, "/v1/completions", three), "limits.max_prompts_per_request=2", "prompt"
    )
    embeddings = {"model": "m", "input": [[1], [2], [3]]}
    assert_limit_error(
        await post(app, "/v1/embeddings", embeddings), "limits.max_prompts_per_request=2", "input"
    )
    # A Responses `input` is one conversation, not a batch of prompts.
    items = [{"role": "user", "content": c} for c in "abc"]
    assert (await post(app, "/v1/responses", {"model": "m", "input": items})).is_success
    assert (await post(app, "/v1/completions", {"model": "m", "prompt": [1, 2, 3]})).is_success


def test_prompt_count_tells_one_prompt_from_a_batch() -> None:
    assert prompt_count("text") == 1
    assert prompt_count([1, 2, 3]) == 1  # token ids of one prompt
    assert prompt_count(["a", "b"]) == 2
    assert prompt_count([[1], [2], [3]]) == 3


async def test_the_deadline_aborts_the_engine_request_of_a_non_streaming_handler() -> None:
    app, _, engine = wrapped(RequestLimits(request_timeout_s=0.2))
    response = await post(app, "/v1/completions", {"model": "m", "prompt": "a", "slow": True})
    assert response.status_code == 408
    await asyncio.wait_for(engine.finished.wait(), 5)
    assert engine.cancelled == ["req-1"]


async def test_a_client_that_leaves_aborts_the_engine_request() -> None:
    """Serve cancels the app's call when the client disconnects (replica.py: request_task)."""
    app, _, engine = wrapped(RequestLimits(request_timeout_s=None))
    body = b'{"model": "m", "prompt": "a", "slow": true}'
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # Serve's proxy: no disconnect message, a cancellation
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        pass

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("test", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
    }
    call = asyncio.create_task(app(scope, receive, send))
    while not engine.started:
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(engine.finished.wait(), 5)
    assert engine.cancelled == ["req-1"]

"""The platform's guards around vLLM's app, without a model: limits checked on what the app hands
the engine, the deadline middleware (408 before the response, an error event after), health.
The real app with the real engine: tests/integration/test_vllm_api.py and test_auth.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from vllm.exceptions import VLLMValidationError

from serving.api.vllm_wrap import RequestDeadline, check_engine_request, guard_generate
from serving.config.access import RequestLimits


def test_a_prompt_over_the_limit_is_vllms_validation_error_naming_the_field() -> None:
    limits = RequestLimits(max_prompt_tokens=4)
    with pytest.raises(VLLMValidationError, match="limits.max_prompt_tokens=4"):
        check_engine_request({"prompt_token_ids": [1] * 5}, SimpleNamespace(max_tokens=1), limits)
    check_engine_request({"prompt_token_ids": [1] * 4}, SimpleNamespace(max_tokens=1), limits)
    # an EngineCoreRequest carries its ids as an attribute
    with pytest.raises(VLLMValidationError):
        check_engine_request(SimpleNamespace(prompt_token_ids=[1] * 9), None, limits)


def test_max_tokens_over_the_limit_is_refused() -> None:
    limits = RequestLimits(max_tokens=16)
    with pytest.raises(VLLMValidationError, match="max_tokens=17 is over the limit"):
        check_engine_request({"prompt_token_ids": [1]}, SimpleNamespace(max_tokens=17), limits)
    check_engine_request({"prompt_token_ids": [1]}, SimpleNamespace(max_tokens=16), limits)


def test_n_over_the_limit_is_refused_on_the_engine_too() -> None:
    with pytest.raises(VLLMValidationError, match="n=17 is over the limit limits.max_n=16"):
        check_engine_request({"prompt_token_ids": [1]}, SimpleNamespace(n=17), RequestLimits())
    check_engine_request({"prompt_token_ids": [1]}, SimpleNamespace(n=16), RequestLimits())


def test_guarded_generate_checks_before_the_engine_sees_the_request() -> None:
    seen = []
    llm = SimpleNamespace(generate=lambda prompt, params, request_id, **kw: seen.append(request_id))
    guard_generate(llm, RequestLimits(max_tokens=2))
    llm.generate({"prompt_token_ids": [1]}, SimpleNamespace(max_tokens=2), "ok", priority=0)
    with pytest.raises(VLLMValidationError):
        llm.generate({"prompt_token_ids": [1]}, SimpleNamespace(max_tokens=3), "over")
    assert seen == ["ok"]


def slow_app(first_chunk: bool) -> FastAPI:
    app = FastAPI()
    cancelled = asyncio.Event()
    app.state.cancelled = cancelled

    @app.get("/slow")
    async def slow():
        async def events():
            try:
                yield b"data: {}\n\n"
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        if first_chunk:
            return StreamingResponse(events(), media_type="text/event-stream")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    return app


async def test_a_request_past_the_deadline_is_cancelled_and_answered_408() -> None:
    app = slow_app(first_chunk=False)
    transport = httpx.ASGITransport(app=RequestDeadline(app, 0.2))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/slow")
    assert response.status_code == 408
    assert "limits.request_timeout_s=0.2" in response.json()["error"]["message"]
    assert app.state.cancelled.is_set()  # vLLM aborts the engine request on this cancellation


async def test_a_stream_past_the_deadline_ends_with_an_error_event() -> None:
    app = slow_app(first_chunk=True)
    transport = httpx.ASGITransport(app=RequestDeadline(app, 0.2))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/slow")
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert app.state.cancelled.is_set()


async def test_fastapis_bare_detail_error_gets_the_openai_shape_and_other_answers_pass() -> None:
    from fastapi import HTTPException

    from serving.api.vllm_wrap import OpenAIErrorBodies

    app = FastAPI()

    @app.post("/parse")
    async def parse():
        raise HTTPException(400, "There was an error parsing the body")

    @app.get("/fine")
    async def fine():
        return {"detail": "a 200 is left alone"}

    transport = httpx.ASGITransport(app=OpenAIErrorBodies(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        bad = await client.post("/parse")
        fine_answer = await client.get("/fine")
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "There was an error parsing the body"
    assert set(bad.json()["error"]) == {"message", "type", "param", "code"}
    assert int(bad.headers["content-length"]) == len(bad.content)
    assert fine_answer.json() == {"detail": "a 200 is left alone"}


async def test_an_empty_assistant_message_in_responses_input_is_a_400_before_vllm() -> None:
    from serving.api.vllm_wrap import RequestBodyCheck

    app, seen = FastAPI(), []

    @app.post("/v1/responses")
    async def responses(body: dict):
        seen.append(body)
        return {"ok": True}

    bad_item = {
        "type": "message",
        "id": "m1",
        "role": "assistant",
        "status": "completed",
        "content": [],
    }
    good = {"model": "m", "input": [{"role": "user", "content": "hi"}]}
    transport = httpx.ASGITransport(app=RequestBodyCheck(app, RequestLimits(max_body_bytes=10_000)))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        bad = await client.post(
            "/v1/responses",
            json={"model": "m", "input": [{"role": "user", "content": "hi"}, bad_item]},
        )
        fine = await client.post("/v1/responses", json=good)
        not_json = await client.post("/v1/responses", content=b"{nope")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "input.1.content"
    assert fine.status_code == 200 and seen == [good]  # the replayed body reached the app intact
    assert (
        not_json.status_code == 422
    )  # left to the app (vLLM's answers it; OpenAIErrorBodies shapes it)

"""Serve's proxy's plain-text refusals in the OpenAI shape (serving.api.proxy_errors), over a stand-in
for Serve's proxy app sending what Ray 2.60's proxy sends (convert_object_to_asgi_messages)."""

from __future__ import annotations

import asyncio

import httpx
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from serving.api.proxy_errors import OpenAIRefusals, middlewares

BACKPRESSURE = (
    b"Request dropped due to backpressure (num_queued_requests=4, max_queued_requests=4)."
)


def proxy(status: int, content_type: bytes, body: bytes, retry_after: bool = True) -> object:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", content_type)]
        headers += [(b"retry-after", b"2")] if retry_after else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:], "more_body": False})

    return app


def get(app: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=OpenAIRefusals(app))  # type: ignore[arg-type]  # an ASGI app
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/v1/chat/completions", json={})

    return asyncio.run(go())


def test_a_full_queue_is_a_503_in_the_openai_shape_with_its_retry_after() -> None:
    response = get(proxy(503, b"text/plain; charset=utf-8", BACKPRESSURE))
    assert (response.status_code, response.headers["retry-after"]) == (503, "2")
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "message": BACKPRESSURE.decode(),
            "type": "service_unavailable_error",
            "param": None,
            "code": "queue_full",
        }
    }


def test_a_timeout_and_a_429_refusal_are_rewritten_too() -> None:
    timeout = get(proxy(408, b"text/plain", b"Request r timed out after 5.0s.", retry_after=False))
    assert (timeout.status_code, timeout.json()["error"]["code"]) == (408, "request_timeout")
    busy = get(proxy(429, b"text/plain", BACKPRESSURE))
    assert busy.json()["error"]["type"] == "rate_limit_error"


def test_a_replicas_own_answers_pass_unchanged() -> None:
    body = b'{"error": {"message": "x", "type": "t", "param": null, "code": 1}}'
    assert get(proxy(503, b"application/json", body)).content == body
    ok = get(proxy(200, b"text/plain", b"plain text from a replica"))
    assert ok.text == "plain text from a replica"


def test_serves_callback_gets_starlette_middleware() -> None:
    assert [m.cls for m in middlewares()] == [OpenAIRefusals]
    assert all(isinstance(m, Middleware) for m in middlewares())

"""Serve's proxy's own refusals in the OpenAI error shape. Serve's HTTP proxy answers a request it
cannot place itself, in plain text: a full queue (max_queued_requests: 503 or 429 with
Retry-After, "Request dropped due to backpressure ...") and a request over its timeout (408). It
carries a single-model app's requests under `http.ingress: proxy`, and under HAProxy whenever the
app has no replica (at zero, HAProxy sends them to Serve's proxy, whose handle holds them while a
replica starts). Serve applies the middlewares a callback returns
(RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH names `middlewares`); this one rewrites only those
plain-text answers, headers kept (Retry-After), and passes every other message through."""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.errors import error_body

# Serve's proxy's own answers (ray.serve._private.http_util.send_http_response_on_exception):
# with Retry-After a full queue (BackPressureError), else a timeout or no deployment to take it.
PROXY_REFUSALS = {408: "request_timeout", 429: "queue_full", 503: "service_unavailable"}


def is_proxy_refusal(start: Message) -> bool:
    """A response start of one of the proxy's plain-text refusals (replicas answer in JSON)."""
    content_type = Headers(raw=start.get("headers", [])).get("content-type", "")
    return start.get("status") in PROXY_REFUSALS and content_type.startswith("text/plain")


def openai_refusal(start: Message, text: str) -> tuple[Message, bytes]:
    """The refusal's start (JSON, its other headers kept) and its OpenAI error body."""
    status = start["status"]
    headers = MutableHeaders(raw=list(start.get("headers", [])))
    code = "queue_full" if "retry-after" in headers else PROXY_REFUSALS[status]
    body = json.dumps(error_body(text.strip(), status, code=code)).encode()
    headers["content-type"] = "application/json"
    headers["content-length"] = str(len(body))
    return {**start, "headers": headers.raw}, body


class OpenAIRefusals:
    """ASGI middleware around Serve's proxy app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def rewriting_send(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and is_proxy_refusal(message):
                held = message  # sent with its body, once the body is complete
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                start, body = openai_refusal(held, b"".join(chunks).decode(errors="replace"))
                await send(start)
                await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, rewriting_send)


def middlewares() -> list[Any]:
    """Serve's HTTP proxy callback (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH)."""
    return [Middleware(OpenAIRefusals)]

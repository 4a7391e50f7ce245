"""Per-request limits from `PlatformConfig.limits`: body size (413), prompt tokens, max_tokens,
choices and prompts per request (400), run time (408, or an error event once a stream has
started). Each message names the config field, so an operator knows what to raise."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import EXEMPT_PATHS, APIKeyAuth, KeyRing
from serving.api.errors import APIError, error_response
from serving.config.access import RequestLimits

T = TypeVar("T")


def check_prompt_tokens(prompt_len: int, limits: RequestLimits | None, param: str) -> None:
    limit = limits.max_prompt_tokens if limits else None
    if limit is not None and prompt_len > limit:
        raise APIError(
            f"the prompt has {prompt_len} tokens; the limit is limits.max_prompt_tokens={limit}",
            param=param,
            code="prompt_too_long",
        )


def check_max_tokens(requested: int | None, limits: RequestLimits | None, param: str) -> None:
    limit = limits.max_tokens if limits else None
    if limit is not None and requested is not None and requested > limit:
        raise APIError(
            f"{param}={requested} is over the limit limits.max_tokens={limit}",
            param=param,
            code="max_tokens_too_large",
        )


def check_n(requested: int | None, limits: RequestLimits | None, param: str = "n") -> None:
    """Choices (or beams) one request asks for; the default limit when the app was given none."""
    limit = (limits or RequestLimits()).max_n
    if requested is not None and requested > limit:
        raise APIError(
            f"{param}={requested} is over the limit limits.max_n={limit}",
            param=param,
            code="n_too_large",
        )


def check_prompt_count(count: int, limits: RequestLimits | None, param: str = "prompt") -> None:
    limit = (limits or RequestLimits()).max_prompts_per_request
    if count > limit:
        raise APIError(
            f"{param} has {count} prompts; the limit is limits.max_prompts_per_request={limit}",
            param=param,
            code="too_many_prompts",
        )


def default_max_tokens(default: int | None, limits: RequestLimits | None) -> int | None:
    """The max_tokens of a request that sets none: the route's default, within the cap."""
    cap = limits.max_tokens if limits else None
    if cap is None:
        return default
    return cap if default is None else min(default, cap)


def timeout_error(seconds: float) -> APIError:
    return APIError(
        f"the request ran longer than limits.request_timeout_s={seconds:g} and was aborted",
        status=408,
        code="request_timeout",
    )


@dataclass(frozen=True)
class Deadline:
    """When a request must be done (loop time); `seconds` None: never."""

    seconds: float | None = None
    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        if seconds is None:
            return cls()
        return cls(seconds, asyncio.get_running_loop().time() + seconds)

    async def wait(self, step: Awaitable[T]) -> T:
        """Await one cancel-safe step (e.g. `Queue.get`); past the deadline, a 408 APIError.
        Per step, not around a generator: a timeout scope across `yield` would cancel whatever
        the consumer is doing at that moment."""
        if self.at is None:
            return await step
        remaining = self.at - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(step, max(remaining, 0))
        except TimeoutError:
            raise timeout_error(self.seconds or 0) from None


def body_too_large(max_bytes: int) -> APIError:
    return APIError(
        f"the request body is over the limit limits.max_body_bytes={max_bytes}",
        status=413,
        code="request_too_large",
    )


class BodySizeLimit:
    """ASGI middleware: bodies over `max_bytes` get 413 before the route reads them. A declared
    Content-Length is checked up front; a chunked body is read (up to the limit) and replayed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def too_large(self) -> APIError:
        return body_too_large(self.max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await error_response(self.too_large())(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        body = await read_body(receive, self.max_bytes)
        if body is None:
            await error_response(self.too_large())(scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)


async def read_body(receive: Receive, max_bytes: int) -> list[Message] | None:
    """The body's messages, or None once they exceed `max_bytes` (the rest is not read)."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # disconnect: let the app see it
        size += len(message.get("body", b""))
        if size > max_bytes:
            return None
        if not message.get("more_body", False):
            return messages


def replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def install_guards(
    app: FastAPI,
    keys: KeyRing | None,
    max_body_bytes: int | None,
    exempt: frozenset[str] = EXEMPT_PATHS,
) -> None:
    """Auth outside the body limit: a request without a key is refused before its body is read.
    `exempt` paths answer without a key. Call before adding outer middleware (the last added
    runs first)."""
    if max_body_bytes is not None:
        app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    if keys is not None and keys.enabled:
        app.add_middleware(APIKeyAuth, keys=keys, exempt=exempt)

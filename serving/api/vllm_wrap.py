"""What the platform adds around vLLM's own OpenAI app, without forking it: API keys, the body
limit, the request deadline, the request limits (vllm_limits), status metrics and a `/health` that
shows the engine's queue. vLLM's app keeps every route and its own errors; these wrap it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import APIKeyAuth, KeyRing
from serving.api.batch_api import BatchRoutes
from serving.api.errors import APIError, error_body, error_response
from serving.api.health import engine_unhealthy, health_body
from serving.api.limits import BodySizeLimit, body_too_large, read_body, replay, timeout_error
from serving.api.observe import StatusCounter
from serving.api.usage import Sink, adapter_of, counted
from serving.api.usage_routes import UsageRoute
from serving.api.vllm_limits import CancelEngineWork, body_limit_error, note_engine_task
from serving.config.access import RequestLimits
from serving.metrics import PlatformMetrics
from serving.state.tenancy import current_principal

# vLLM reads a request's priority from this header too (vllm/entrypoints/generate/base/serving.py).
PRIORITY_HEADER = "x-vllm-priority"


def prompt_token_count(prompt: Any) -> int | None:
    """Tokens of what vLLM's serving layer hands the engine (an `EngineCoreRequest` or a
    tokens/engine input dict); None when it carries no token ids (e.g. a stream of inputs)."""
    ids = (
        prompt.get("prompt_token_ids")
        if isinstance(prompt, dict)
        else getattr(prompt, "prompt_token_ids", None)
    )
    return None if ids is None else len(ids)


def check_engine_request(prompt: Any, sampling_params: Any, limits: RequestLimits) -> None:
    """The platform's prompt, n and max_tokens limits on what reaches the engine, raised as
    vLLM's validation error (its app answers 400 in the OpenAI shape). vLLM has already clamped
    max_tokens to the capped default (see vllm_limits), so the request body is checked first;
    this holds for any route whose body the platform does not read."""
    from vllm.exceptions import VLLMValidationError

    prompt_len = prompt_token_count(prompt)
    if (
        limits.max_prompt_tokens is not None
        and prompt_len is not None
        and prompt_len > limits.max_prompt_tokens
    ):
        raise VLLMValidationError(
            f"the prompt has {prompt_len} tokens; the limit is "
            f"limits.max_prompt_tokens={limits.max_prompt_tokens}",
            parameter="prompt",
            value=prompt_len,
        )
    n = getattr(sampling_params, "n", None)
    if isinstance(n, int) and n > limits.max_n:  # routes whose body fields the platform misses
        raise VLLMValidationError(
            f"n={n} is over the limit limits.max_n={limits.max_n}", parameter="n", value=n
        )
    requested = getattr(sampling_params, "max_tokens", None)
    if limits.max_tokens is not None and requested is not None and requested > limits.max_tokens:
        raise VLLMValidationError(
            f"max_tokens={requested} is over the limit limits.max_tokens={limits.max_tokens}",
            parameter="max_tokens",
            value=requested,
        )


def guard_generate(
    llm: Any, limits: RequestLimits, usage: Sink | None = None, model: str = ""
) -> None:
    """Check every request the app sends `llm` (completions, chat, responses alike) first, note
    the task that starts it, to cancel with its HTTP request (vllm_limits), and count what it
    used for its tenant (`usage`, serving/api/usage.py)."""
    generate: Callable[..., AsyncIterator[Any]] = llm.generate

    def guarded(
        prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        check_engine_request(prompt, sampling_params, limits)
        note_engine_task()
        stream = generate(prompt, sampling_params, request_id, *args, **kwargs)
        if usage is None:
            return stream
        return counted(stream, sampling_params, model, adapter_of(kwargs), usage)

    llm.generate = guarded  # this engine only, ahead of vLLM's serving classes that call it


class RequestDeadline:
    """ASGI middleware: a request still running after `seconds` is cancelled (its engine
    requests are aborted: CancelEngineWork) and answered 408, or, once its response has
    started, ended with an error event."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started: dict[str, Any] = {}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracking_send), self.seconds)
        except TimeoutError:
            err = timeout_error(self.seconds)
            if not started:
                await error_response(err)(scope, receive, send)
                return
            body = error_body(err.message, err.status, err.param, err.code)
            event = f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
            await send({"type": "http.response.body", "body": event, "more_body": False})


class OpenAIErrorBodies:
    """ASGI middleware: a 4xx whose JSON body is FastAPI's bare `{"detail": ...}` (vLLM's app
    answers a body that is not JSON that way) gets the OpenAI error shape. Only such error
    responses are buffered; every other response, streams included, passes through as sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}

        async def reshaping_send(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                held["start"], held["body"] = message, b""
                return
            if "start" not in held:
                await send(message)
                return
            held["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                await self._send_reshaped(held["start"], held["body"], send)

        await self.app(scope, receive, reshaping_send)

    @staticmethod
    async def _send_reshaped(start: Message, body: bytes, send: Send) -> None:
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if isinstance(payload, dict) and set(payload) == {"detail"}:
            detail = payload["detail"]
            message = detail if isinstance(detail, str) else json.dumps(detail)
            body = json.dumps(error_body(message, start["status"])).encode()
            headers = [
                (k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"
            ]
            start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})


def empty_assistant_message(payload: Any) -> APIError | None:
    """A Responses API `input` item from the assistant with an empty `content` list: vLLM's app
    reads its first part unchecked and answers 500 (IndexError); this is the 400 it should be."""
    items = payload.get("input") if isinstance(payload, dict) else None
    for index, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("role") == "assistant" and item.get("content") == []:
            return APIError(
                f"input[{index}].content: an assistant message needs at least one content part",
                param=f"input.{index}.content",
            )
    return None


def json_payload(body: bytes) -> Any:
    """The parsed body; None when it is not JSON (vLLM's app answers that itself)."""
    try:
        return json.loads(body)
    except ValueError:
        return None


def priority_refusal(payload: Any, headers: Headers) -> APIError | None:
    """A request that sets vLLM's `priority` (body or X-Vllm-Priority) to anything but 0, from a
    tenant that may not (auth.tenants[].may_set_priority): it would go ahead of every other
    tenant's requests in the engine's priority scheduler."""
    principal = current_principal.get()
    if principal is None or principal.may_set_priority:  # the platform's own (batch lines)
        return None
    asked = [payload.get("priority")] if isinstance(payload, dict) else []
    asked.append(headers.get(PRIORITY_HEADER))
    if all(value in (None, 0, "0") for value in asked):
        return None
    return APIError(
        f"tenant {principal.tenant} may not set `priority` (auth.tenants[].may_set_priority)",
        status=403,
        param="priority",
        code="priority_not_allowed",
    )


class RequestBodyCheck:
    """ASGI middleware: the checks of a POST body before it reaches vLLM's app, the platform's
    request limits (vllm_limits) and what `/v1/responses` lacks. The body is already within the
    size limit, so it is read and replayed."""

    def __init__(self, app: ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limits.max_body_bytes
        messages = await read_body(receive, max_bytes)
        if messages is None:  # a declared length that understated the body
            await error_response(body_too_large(max_bytes))(scope, receive, send)
            return
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        payload = json_payload(body)
        problem = priority_refusal(payload, Headers(scope=scope)) or self.problem(
            scope["path"], payload
        )
        if problem is not None:
            await error_response(problem)(scope, receive, send)
            return
        await self.app(scope, replay(messages, receive), send)

    def problem(self, path: str, payload: Any) -> APIError | None:
        if path.endswith("/v1/responses"):
            problem = empty_assistant_message(payload)
            if problem is not None:
                return problem
        return body_limit_error(path, payload, self.limits)


def replace_health(app: FastAPI, health: Callable[[], Any]) -> None:
    """The platform's `/health` (engine queue, start-up timings) instead of vLLM's empty one."""
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
    app.add_api_route("/health", health, methods=["GET"], include_in_schema=True)


class WrappedApp:
    """An ASGI app in front of a FastAPI app that has already built its middleware stack (vLLM's
    does so while it is set up). Exception handlers still go to the inner app, as Serve adds its
    own (back-pressure errors) to an ingress app that has `add_exception_handler`."""

    def __init__(self, outer: ASGIApp, inner: FastAPI, below_keys: ASGIApp | None = None) -> None:
        self.outer = outer
        self.inner = inner
        # The chain under the API-key check (limits, deadline, vLLM's app): batch lines run here.
        self.below_keys = below_keys or outer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.outer(scope, receive, send)

    def add_exception_handler(self, exc: Any, handler: Any) -> None:
        self.inner.add_exception_handler(exc, handler)


def wrap_vllm_app(
    app: FastAPI,
    engine: Any,
    metrics: PlatformMetrics | None,
    limits: RequestLimits,
    keys: KeyRing | None,
    batch: ASGIApp | None = None,
    traced: Callable[[ASGIApp], ASGIApp] | None = None,
    usage: Sink | None = None,
    quotas: Callable[[ASGIApp], ASGIApp] | None = None,
    ledger: ASGIApp | None = None,
) -> WrappedApp:
    """vLLM's app with the platform's guards: outermost the status count, then the API key,
    the Batch API's routes (`batch`, with their own file size limit), the body limit, the
    deadline, the request limits on the body; innermost the abort of a cancelled request's
    engine work. The prompt limit (and the rest again) sits on the engine. `traced` puts the
    request's span around all of it (tracing on). `usage` counts each engine request for its
    tenant; `quotas` (tenants' limits and fair share) sits right below the key check, and
    `ledger` (GET /v1/usage) above it."""
    model = metrics.labels.model if metrics is not None else ""
    guard_generate(engine.llm, limits, usage, model)

    async def health() -> JSONResponse:
        try:
            await engine.check_health()
        except Exception as err:
            return error_response(engine_unhealthy(err))
        return JSONResponse(health_body(engine, metrics))

    replace_health(app, health)
    outer: ASGIApp = RequestBodyCheck(CancelEngineWork(OpenAIErrorBodies(app)), limits)
    if limits.request_timeout_s is not None:
        outer = RequestDeadline(outer, limits.request_timeout_s)
    outer = BodySizeLimit(outer, limits.max_body_bytes)
    below_keys = outer
    if batch is not None:
        outer = BatchRoutes(batch, outer)
    if quotas is not None:
        outer = quotas(outer)
    if ledger is not None:
        outer = UsageRoute(ledger, outer)
    if keys is not None:  # a request without a key is refused before its body is read
        outer = APIKeyAuth(outer, keys)  # and one with a key runs as its tenant
    if metrics is not None:
        outer = StatusCounter(outer, metrics)
    if traced is not None:
        outer = traced(outer)
    return WrappedApp(outer, app, below_keys)

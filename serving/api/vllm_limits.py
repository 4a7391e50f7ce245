"""The platform's per-request limits on vLLM's app, and the engine work of a request that ends.

What the client asked for is checked in the request body, before vLLM's app reads it: vLLM takes
the lower of a request's max_tokens and its generation default (which the platform caps, see
`vllm_args.server_options`), and its beam search asks the engine for one token at a time, so
what reaches the engine no longer shows what was asked.

vLLM's `with_cancellation` runs a non-streaming handler in a task of its own and leaves that task
running when the request's own task is cancelled (Serve cancels it when the client leaves; so
does the deadline): the engine would generate on to max_tokens for nobody. Each request's tasks
that start engine requests are noted, and cancelled with it, so vLLM's `generate` aborts them."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api import limits as lim
from serving.api.errors import APIError
from serving.config.access import RequestLimits

# Fields that bound the tokens of one choice (chat and completions, chat's newer name, responses).
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Fields that multiply the sequences of one prompt (beam search's width is `n`).
CHOICE_FIELDS = ("n", "best_of")
# /inference/v1/generate (vLLM's scale-out route) nests its sampling parameters.
NESTED_PARAMS = "sampling_params"


def as_count(value: Any) -> int | None:
    """An integer as vLLM's request models accept it (400, 400.0, "400"); None otherwise (vLLM
    refuses the value itself)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def prompt_count(value: Any) -> int:
    """Prompts in a completions `prompt` or an embeddings `input`: a text or a list of token ids
    is one prompt, a list of texts or of token-id lists is a batch."""
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        return len(value)
    return 1


def check_sampling_fields(params: dict[str, Any], limits: RequestLimits, prefix: str = "") -> None:
    for field in TOKEN_FIELDS:
        lim.check_max_tokens(as_count(params.get(field)), limits, prefix + field)
    for field in CHOICE_FIELDS:
        lim.check_n(as_count(params.get(field)), limits, prefix + field)


def check_request_body(path: str, payload: Any, limits: RequestLimits) -> None:
    """The limits on what a request body asks for (any route of vLLM's app: chat, completions,
    responses, messages, beam search); an APIError naming the limit."""
    if not isinstance(payload, dict):
        return
    check_sampling_fields(payload, limits)
    nested = payload.get(NESTED_PARAMS)
    if isinstance(nested, dict):
        check_sampling_fields(nested, limits, f"{NESTED_PARAMS}.")
    if "prompt" in payload:
        lim.check_prompt_count(prompt_count(payload["prompt"]), limits, "prompt")
    if path.endswith("/v1/embeddings") and "input" in payload:
        lim.check_prompt_count(prompt_count(payload["input"]), limits, "input")


def body_limit_error(path: str, payload: Any, limits: RequestLimits) -> APIError | None:
    try:
        check_request_body(path, payload, limits)
    except APIError as err:
        return err
    return None


# The tasks of the current HTTP request that started engine requests (None outside one).
_engine_tasks: contextvars.ContextVar[set[asyncio.Task] | None] = contextvars.ContextVar(
    "engine_tasks", default=None
)


def note_engine_task() -> None:
    """Called as an engine request starts: the task it runs in ends with the HTTP request. Tasks
    created later copy the context, so vLLM's handler task finds its request's set."""
    tasks = _engine_tasks.get()
    if tasks is None:  # not inside an HTTP request of the wrapped app
        return
    task = asyncio.current_task()
    if task is not None:
        tasks.add(task)


class CancelEngineWork:
    """ASGI middleware: when a request's call is cancelled (the client left, the deadline), the
    tasks that started its engine requests are cancelled too; vLLM's `generate` then aborts each
    engine request. Tasks that already finished (a stream's handler) are left alone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tasks: set[asyncio.Task] = set()
        token = _engine_tasks.set(tasks)
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            cancel_other_tasks(tasks)
            raise
        finally:
            _engine_tasks.reset(token)


def cancel_other_tasks(tasks: set[asyncio.Task]) -> None:
    """Cancel `tasks` but the running one (being cancelled already)."""
    current = asyncio.current_task()
    for task in tasks:
        if task is not current and not task.done():
            task.cancel()

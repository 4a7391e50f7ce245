"""The OpenAI-compatible FastAPI app every engine deployment serves (models, completions, chat,
health), streaming with SSE. The engine is injected, so the app is tested without a model."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from openai.types import Model
from pydantic import BaseModel
from sse_starlette import EventSourceResponse

from serving.api import generation as gen
from serving.api import responses as resp
from serving.api.auth import KeyRing
from serving.api.errors import APIError, error_body, install_error_handlers
from serving.api.health import engine_unhealthy, health_body
from serving.api.limits import install_guards
from serving.api.observe import StatusCounter, observed
from serving.api.protocol import ChatCompletionRequest, CompletionRequest
from serving.config.access import RequestLimits
from serving.engines.base import Delta, Engine
from serving.metrics import PlatformMetrics

logger = logging.getLogger(__name__)

SSE_DONE = "[DONE]"


def json_response(obj: BaseModel) -> JSONResponse:
    return JSONResponse(obj.model_dump(mode="json", exclude_none=False))


def sse(events: AsyncIterator[str]) -> EventSourceResponse:
    # sse-starlette frames `data:` events and cancels the generator when the client disconnects;
    # cancellation reaches the engine and aborts the request there. Events end in "\n\n" as
    # vLLM's server sends them: vLLM's bench client splits on "\n\n" and, given sse-starlette's
    # default "\r\n", loses every event that arrives in one read with another.
    return EventSourceResponse(_as_events(events), ping=15, sep="\n")


async def _as_events(events: AsyncIterator[str]) -> AsyncIterator[dict]:
    async for data in events:
        yield {"data": data}


async def stream_errors_as_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once streaming has started the status is sent: an engine failure becomes an error event."""
    try:
        async for data in events:
            yield data
    except APIError as err:
        yield error_event(error_body(err.message, err.status, err.param, err.code))
    except Exception:
        logger.exception("stream failed")
        yield error_event(error_body("internal server error", 500, code="internal"))
    yield SSE_DONE


def error_event(body: dict) -> str:
    """An error body as an event's data, encoded as JSONResponse encodes it (always to bytes)."""
    return bytes(JSONResponse(body).body).decode()


async def completion_events(
    deltas: AsyncIterator[tuple[gen.Job, Delta]],
    request_id: str,
    request: CompletionRequest,
    jobs: list[gen.Job],
    decoder: resp.Decoder,
) -> AsyncIterator[str]:
    stream = resp.CompletionStream(request_id, request, decoder)
    completion_tokens = 0
    async for job, delta in deltas:
        completion_tokens += delta.num_tokens
        yield stream.chunk(job, delta).model_dump_json()
    if request.include_usage_in_stream:
        yield resp.usage_chunk(request_id, request.model, jobs, completion_tokens).model_dump_json()


async def chat_events(
    deltas: AsyncIterator[tuple[gen.Job, Delta]],
    request_id: str,
    request: ChatCompletionRequest,
    jobs: list[gen.Job],
    decoder: resp.Decoder,
) -> AsyncIterator[str]:
    for job in jobs:  # the role comes first, once per choice, as OpenAI sends it
        yield resp.chat_chunk(
            request_id, request.model, job.index, "", None, role="assistant"
        ).model_dump_json()
    completion_tokens = 0
    async for job, delta in deltas:
        completion_tokens += delta.num_tokens
        chunk = resp.chat_chunk(
            request_id,
            request.model,
            job.index,
            delta.text,
            delta.finish_reason,
            extra=delta.extra,
            logprobs=resp.chat_logprobs(request, delta.logprobs, decoder),
        )
        yield chunk.model_dump_json()
    if request.include_usage_in_stream:
        final = resp.chat_chunk(request_id, request.model, 0, None, None)
        final.choices = []
        final.usage = resp.usage(jobs, completion_tokens)
        yield final.model_dump_json()


def build_openai_app(
    engine: Engine,
    title: str = "llm-serving",
    metrics: PlatformMetrics | None = None,
    limits: RequestLimits | None = None,
    keys: KeyRing | None = None,
) -> FastAPI:
    """OpenAI routes under /v1 plus /health, all errors in the OpenAI error shape; `keys` (when
    any) guard every route but /health, `limits` bound each request."""
    app = FastAPI(title=title, version="1")
    install_error_handlers(app)
    install_guards(app, keys, limits.max_body_bytes if limits else None)
    timeout_s = limits.request_timeout_s if limits else None
    created = int(time.time())
    decoder = resp.Decoder(engine.tokenizer)
    if metrics is not None:
        app.add_middleware(StatusCounter, metrics=metrics)

    def deltas(jobs: list[gen.Job]) -> AsyncIterator[tuple[gen.Job, Delta]]:
        return observed(
            gen.stream_jobs(engine, jobs, timeout_s), jobs, metrics, time.perf_counter()
        )

    @app.get("/v1/models")
    async def list_models() -> JSONResponse:
        model = Model(id=engine.model_name, created=created, object="model", owned_by="llm-serving")
        return JSONResponse({"object": "list", "data": [model.model_dump(mode="json")]})

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> JSONResponse:
        if model_id != engine.model_name:
            raise APIError(
                f"The model `{model_id}` does not exist.", 404, "model", "model_not_found"
            )
        model = Model(id=engine.model_name, created=created, object="model", owned_by="llm-serving")
        return json_response(model)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        gen.check_request(request, engine)
        request_id = gen.new_request_id("cmpl")
        jobs = gen.completion_jobs(engine, request_id, request, limits)
        if request.stream:
            events = completion_events(deltas(jobs), request_id, request, jobs, decoder)
            return sse(stream_errors_as_events(events))
        results = await gen.collect(deltas(jobs), jobs)
        return json_response(resp.completion_response(request_id, request, jobs, results, decoder))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest):
        gen.check_request(request, engine)
        request_id = gen.new_request_id("chatcmpl")
        jobs = gen.chat_jobs(engine, request_id, request, limits)
        if request.stream:
            events = chat_events(deltas(jobs), request_id, request, jobs, decoder)
            return sse(stream_errors_as_events(events))
        results = await gen.collect(deltas(jobs), jobs)
        return json_response(resp.chat_response(request_id, request, jobs, results, decoder))

    @app.get("/health")
    async def health() -> JSONResponse:
        try:
            await engine.check_health()
        except Exception as err:
            raise engine_unhealthy(err) from None
        return JSONResponse(health_body(engine, metrics))

    return app

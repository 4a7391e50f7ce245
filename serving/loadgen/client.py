"""The streaming client: one OpenAI-compatible request at a time, timed the way vLLM's `bench
serve` times it (TTFT to the first content chunk, ITL between content chunks, end-to-end latency),
and a runner that sends a load level's requests, bounded by count and by a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from serving.loadgen.workloads import LoadLevel, RequestSpec

NOT_STARTED = "not_started"


def env_api_key() -> str:
    """The key sent to targets: OPENAI_API_KEY, as the openai client and `conformance` read it."""
    return os.environ.get("OPENAI_API_KEY", "unused")


def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {env_api_key()}"}


REPLICA_HEADER = "x-llm-serving-replica"


class TargetError(RuntimeError):
    """A target that cannot be benchmarked at all (unreachable, not an OpenAI server)."""


@dataclass(frozen=True)
class Target:
    name: str
    base_url: str  # an OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # the model asked for on this target; None: the run's model

    @property
    def origin(self) -> str:
        """The server root the OpenAI routes hang off (where /health and /metrics live)."""
        base = self.base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class RequestOptions:
    model: str
    endpoint: str = "completions"  # or "chat"
    fixed_length: bool = True  # ignore_eos + min_tokens: every engine generates the same work
    temperature: float = 0.0
    timeout_s: float = 300.0
    api_key: str = field(default_factory=env_api_key)


@dataclass
class RequestResult:
    """One request, with vLLM's `RequestFuncOutput` field names (seconds)."""

    success: bool = False
    status: str = "ok"  # ok, http_503, timeout, connection, stream_error, not_started, ...
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    retry_after: str = ""  # the Retry-After header of a refusal (503/429)
    model: str = ""  # the model requested
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache held (usage)
    replica: str = ""  # the replica that answered (the platform's x-llm-serving-replica header)


def request_kwargs(opts: RequestOptions, spec: RequestSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": spec.model or opts.model,
        "max_tokens": spec.output_len,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.fixed_length:
        kwargs["extra_body"] = {"ignore_eos": True, "min_tokens": spec.output_len}
    if spec.session is not None:
        kwargs["user"] = spec.session
    if opts.endpoint == "chat":
        kwargs["messages"] = list(spec.messages or ({"role": "user", "content": spec.prompt},))
    else:
        kwargs["prompt"] = spec.prompt
    return kwargs


def chunk_text(chunk: Any) -> str:
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    if hasattr(choice, "delta"):
        return choice.delta.content or ""
    return choice.text or ""


async def _stream(client: openai.AsyncOpenAI, opts: RequestOptions, spec: RequestSpec) -> Any:
    kwargs = request_kwargs(opts, spec)
    if opts.endpoint == "chat":
        return await client.chat.completions.create(**kwargs)
    return await client.completions.create(**kwargs)


async def _consume(stream: Any, result: RequestResult) -> None:
    last = result.start_time
    chunks = 0
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            result.prompt_len = chunk.usage.prompt_tokens
            result.output_tokens = chunk.usage.completion_tokens
            details = chunk.usage.prompt_tokens_details
            result.cached_tokens = details.cached_tokens if details else None
        if not chunk_text(chunk):
            continue
        if chunks == 0:
            result.ttft = now - result.start_time
        else:
            result.itl.append(now - last)
        last = now
        chunks += 1
    result.latency = time.perf_counter() - result.start_time
    usage_tokens = result.output_tokens
    result.output_tokens = usage_tokens or chunks  # servers without usage in streams
    # Tokens that detokenize to nothing (special tokens) are still work done: a stream whose usage
    # counts tokens succeeded even without text; its first token is only seen at the end.
    result.success = chunks > 0 or usage_tokens > 0
    if chunks == 0 and result.success:
        result.ttft = result.latency
    if not result.success:
        result.status, result.error = "empty", "the stream carried no text"


def _fail(result: RequestResult, status: str, err: BaseException) -> RequestResult:
    result.success, result.status = False, status
    result.error = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
    result.latency = time.perf_counter() - result.start_time
    return result


async def send_request(
    client: openai.AsyncOpenAI, opts: RequestOptions, spec: RequestSpec
) -> RequestResult:
    """Send one streaming request; failures are recorded by kind, never raised."""
    result = RequestResult(start_time=time.perf_counter(), model=spec.model or opts.model)
    try:
        async with asyncio.timeout(opts.timeout_s):  # bounds the whole stream, not one read
            stream = await _stream(client, opts, spec)
            result.replica = stream.response.headers.get(REPLICA_HEADER, "")
            async with stream:  # closes the connection on a timeout or a broken stream too
                await _consume(stream, result)
    except openai.APIStatusError as err:
        result.retry_after = err.response.headers.get("retry-after", "")
        return _fail(result, f"http_{err.status_code}", err)
    except (TimeoutError, openai.APITimeoutError) as err:
        return _fail(result, "timeout", err)
    except openai.APIConnectionError as err:
        return _fail(result, "connection", err)
    except (openai.APIError, httpx.HTTPError, ValueError) as err:
        return _fail(result, "stream_error", err)
    return result


def make_client(target: Target, opts: RequestOptions) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=target.base_url, api_key=opts.api_key, max_retries=0, timeout=opts.timeout_s
    )


@dataclass
class ChunkRun:
    results: list[RequestResult]
    duration: float  # first send to last answer, seconds


async def _paced(
    client: openai.AsyncOpenAI,
    opts: RequestOptions,
    spec: RequestSpec,
    offset: float,
    t0: float,
    deadline: float,
    gate: asyncio.Semaphore | None,
    on_done: Callable[[], None],
) -> RequestResult:
    await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
    async with gate or contextlib.nullcontext():
        if time.perf_counter() >= deadline:  # the time cap: stop starting, let in-flight finish
            result = RequestResult(status=NOT_STARTED)
        else:
            result = await send_request(client, opts, spec)
    on_done()
    return result


def conversations(specs: list[RequestSpec], offsets: tuple[float, ...]) -> list[list[int]]:
    """Indices of the requests in send order: a conversation's turns form one chain (each turn
    after the last answer); every other request is a chain of its own."""
    chains: dict[object, list[int]] = {}
    for index, spec in enumerate(specs[: len(offsets)]):
        key = ("conversation", spec.conversation) if spec.conversation is not None else index
        chains.setdefault(key, []).append(index)
    return list(chains.values())


async def run_level(
    client: openai.AsyncOpenAI,
    opts: RequestOptions,
    level: LoadLevel,
    specs: list[RequestSpec],
    max_duration_s: float,
    on_done: Callable[[], None] = lambda: None,
) -> ChunkRun:
    """Send `level.num_requests` requests (closed loop under a concurrency cap, or at the level's
    arrival offsets; a conversation's turns one after another); none starts after
    `max_duration_s`, each is bounded by the request timeout."""
    gate = asyncio.Semaphore(level.concurrency) if level.concurrency else None
    offsets = level.arrivals or (0.0,) * level.num_requests
    t0 = time.perf_counter()
    deadline = t0 + max_duration_s
    results: list[RequestResult] = [RequestResult(status=NOT_STARTED)] * min(
        len(specs), len(offsets)
    )

    async def chain(indices: list[int]) -> None:
        for index in indices:
            results[index] = await _paced(
                client, opts, specs[index], offsets[index], t0, deadline, gate, on_done
            )

    await asyncio.gather(*(chain(indices) for indices in conversations(specs, offsets)))
    started = [r for r in results if r.status != NOT_STARTED]
    end = max((r.start_time + r.latency for r in started), default=t0)
    return ChunkRun(list(results), max(end - t0, 1e-9))


async def served_models(target: Target, timeout_s: float = 10.0) -> list[str]:
    """GET /models: proves the target is reachable and speaks the OpenAI API."""
    url = f"{target.base_url.rstrip('/')}/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(url, headers=auth_headers())
    except httpx.HTTPError as err:
        raise TargetError(
            f"target {target.name}: cannot reach {url} ({type(err).__name__})"
        ) from None
    try:
        response.raise_for_status()
        ids = [item["id"] for item in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        raise TargetError(
            f"target {target.name}: {url} is not an OpenAI-compatible server "
            f"(HTTP {response.status_code}, no model list)"
        ) from None
    if not ids:
        raise TargetError(f"target {target.name}: {url} serves no model")
    return ids

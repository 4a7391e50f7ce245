"""Turn validated OpenAI requests into engine work and run it; serving/api/responses.py turns the
results into OpenAI objects."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from serving.api import limits as lim
from serving.api.errors import APIError
from serving.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from serving.config.access import RequestLimits
from serving.engines.base import Delta, Engine, SamplingSpec, TokenLogprob
from serving.engines.sampling_defaults import MODEL_SAMPLING_FIELDS

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI legacy completions default


@dataclass
class Job:
    """One choice to generate: which prompt, which sampling, which output index."""

    index: int
    prompt_index: int
    choice: int  # which of the n choices of its prompt
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec


@dataclass
class ChoiceResult:
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    extra: dict = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(request: SamplingRequest, engine: Engine) -> None:
    if request.model != engine.model_name:
        raise APIError(
            f"The model `{request.model}` does not exist; this server serves `{engine.model_name}`.",
            status=404,
            param="model",
            code="model_not_found",
        )


def check_mode(request: SamplingRequest, engine: Engine) -> None:
    if request.mode is not None and request.mode not in engine.modes:
        offered = ", ".join(engine.modes) or "none on this engine"
        raise APIError(
            f"unknown mode `{request.mode}` (modes: {offered})", param="mode", code="unknown_mode"
        )


def check_logprobs(request: SamplingRequest, engine: Engine) -> None:
    """An engine that cannot score tokens says so (400) rather than answering without logprobs."""
    asked = request.sample_logprobs is not None or request.prompt_logprobs is not None
    if asked and not getattr(engine, "supports_logprobs", False):
        raise APIError("logprobs are not offered by this engine", param="logprobs")


def check_request(request: SamplingRequest, engine: Engine) -> None:
    """What the engine must offer for this request: its model, the mode, logprobs."""
    check_model(request, engine)
    check_mode(request, engine)
    check_logprobs(request, engine)


def tokenize_prompt(engine: Engine, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        vocab = len(engine.tokenizer)
        if any(token < 0 or token >= vocab for token in prompt):
            raise APIError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        return prompt
    return list(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])


def chat_prompt_ids(engine: Engine, request: ChatCompletionRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    try:
        ids = engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    except Exception as err:  # a template that rejects this conversation (e.g. role order)
        raise APIError(
            f"messages: cannot apply the chat template: {err}", param="messages"
        ) from None
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def resolve_max_tokens(
    requested: int | None, default: int | None, prompt_len: int, limit: int
) -> int:
    """Validate prompt length and max_tokens against the context window (400s name the limit)."""
    room = limit - prompt_len
    if prompt_len == 0:
        raise APIError("prompt must contain at least one token", param="prompt")
    if room <= 0:
        raise APIError(
            f"This model's maximum context length is {limit} tokens, but the prompt has "
            f"{prompt_len} tokens.",
            param="prompt",
            code="context_length_exceeded",
        )
    max_tokens = requested if requested is not None else min(default or room, room)
    if max_tokens > room:
        raise APIError(
            f"max_tokens ({max_tokens}) plus the prompt ({prompt_len} tokens) exceeds this "
            f"model's maximum context length of {limit} tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return max_tokens


def sampling_values(request: SamplingRequest, defaults: dict[str, float]) -> dict[str, Any]:
    """The request's sampling fields; one it leaves out takes the model's default, if any."""
    values: dict[str, Any] = {}
    for key in MODEL_SAMPLING_FIELDS:
        value = getattr(request, key)
        value = defaults.get(key) if value is None else value
        if value is not None:
            values[key] = value
    if values.get("top_k", 0) < 0:  # OpenAI-style -1 and vLLM's 0 both mean "every token"
        values["top_k"] = 0
    return values


def sampling_spec(
    request: SamplingRequest, max_tokens: int, choice: int, defaults: dict[str, float] | None = None
) -> SamplingSpec:
    seed = None if request.seed is None else request.seed + choice
    return SamplingSpec(
        max_tokens=max_tokens,
        stop=tuple(request.stop_list),
        seed=seed,
        ignore_eos=request.ignore_eos,
        min_tokens=min(request.min_tokens, max_tokens),
        mode=request.mode,
        timings=request.timings,
        logprobs=request.sample_logprobs,
        prompt_logprobs=request.prompt_logprobs,
        **sampling_values(request, defaults or {}),
    )


def plan_jobs(
    request_id: str,
    request: SamplingRequest,
    prompts: list[list[int]],
    token_limit: int | None,
    default_max_tokens: int | None,
    max_model_len: int,
    limits: RequestLimits | None = None,
    prompt_param: str = "prompt",
    sampling_defaults: dict[str, float] | None = None,
) -> list[Job]:
    lim.check_max_tokens(token_limit, limits, "max_tokens")
    lim.check_n(request.n, limits)
    default_max_tokens = lim.default_max_tokens(default_max_tokens, limits)
    jobs = []
    for p, ids in enumerate(prompts):
        lim.check_prompt_tokens(len(ids), limits, prompt_param)
        max_tokens = resolve_max_tokens(token_limit, default_max_tokens, len(ids), max_model_len)
        for c in range(request.n):
            index = p * request.n + c
            spec = sampling_spec(request, max_tokens, c, sampling_defaults)
            jobs.append(Job(index, p, c, f"{request_id}-{index}", ids, spec))
    return jobs


def completion_jobs(
    engine: Engine, request_id: str, request: CompletionRequest, limits: RequestLimits | None = None
) -> list[Job]:
    lim.check_prompt_count(len(request.prompts()), limits)
    prompts = [tokenize_prompt(engine, prompt) for prompt in request.prompts()]
    return plan_jobs(
        request_id,
        request,
        prompts,
        request.max_tokens,
        COMPLETIONS_DEFAULT_MAX_TOKENS,
        engine.max_model_len,
        limits,
        sampling_defaults=engine.sampling_defaults,
    )


def chat_jobs(
    engine: Engine,
    request_id: str,
    request: ChatCompletionRequest,
    limits: RequestLimits | None = None,
) -> list[Job]:
    prompt = chat_prompt_ids(engine, request)
    return plan_jobs(
        request_id,
        request,
        [prompt],
        request.token_limit,
        None,
        engine.max_model_len,
        limits,
        prompt_param="messages",
        sampling_defaults=engine.sampling_defaults,
    )


async def stream_jobs(
    engine: Engine, jobs: list[Job], timeout_s: float | None = None
) -> AsyncIterator[tuple[Job, Delta]]:
    """Run every job concurrently and yield deltas as they come; leaving early, or running past
    `timeout_s` (a 408 APIError), cancels the rest (and cancellation aborts each request inside
    the engine)."""
    deadline = lim.Deadline.after(timeout_s)
    queue: asyncio.Queue[tuple[Job, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(job: Job) -> None:
        try:
            async for delta in engine.generate(job.request_id, job.prompt_token_ids, job.sampling):
                await queue.put((job, delta))
            await queue.put((job, None))
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # surface engine failures to the consumer
            await queue.put((job, err))

    tasks = [asyncio.create_task(pump(job)) for job in jobs]
    remaining = len(jobs)
    try:
        while remaining:
            job, item = await deadline.wait(queue.get())
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield job, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(deltas: AsyncIterator[tuple[Job, Delta]], jobs: list[Job]) -> list[ChoiceResult]:
    results = [ChoiceResult() for _ in jobs]
    async for job, delta in deltas:
        result = results[job.index]
        result.text += delta.text
        result.num_tokens += delta.num_tokens
        result.finish_reason = delta.finish_reason or result.finish_reason
        result.extra.update(delta.extra or {})
        result.logprobs.extend(delta.logprobs or ())
        if delta.prompt_logprobs is not None:
            result.prompt_logprobs = delta.prompt_logprobs
    return results

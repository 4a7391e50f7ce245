"""OpenAI response objects (the `openai` package's types) from engine results and deltas: whole
responses, streamed chunks, usage, and echo and logprobs as vLLM's servers return them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.completion_choice import Logprobs as CompletionLogprobs

from serving.api import logprobs as lp
from serving.api.generation import ChoiceResult, Job
from serving.api.protocol import ChatCompletionRequest, CompletionRequest
from serving.engines.base import Delta, TokenLogprob


@dataclass(frozen=True)
class Decoder:
    """Token ids to text with the engine's tokenizer (vLLM decodes each logprob token alone)."""

    tokenizer: Any

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def prompt(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)


def usage(jobs: list[Job], completion_tokens: int) -> CompletionUsage:
    prompt_tokens = sum(len(j.prompt_token_ids) for j in jobs if j.choice == 0)
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion_text_and_logprobs(
    request: CompletionRequest,
    job: Job,
    text: str,
    output: Sequence[TokenLogprob] | None,
    prompt: Sequence[TokenLogprob | None] | None,
    echo: bool,
    decoder: Decoder,
    text_offset: int = 0,
) -> tuple[str, CompletionLogprobs | None]:
    """One choice's text and logprobs; with `echo` (the whole response, or a choice's first
    chunk) the prompt and its logprobs come first."""
    positions: list[lp.Position] = []
    if echo:
        text = request.prompt_text(job.prompt_index, decoder.prompt) + text
        positions = lp.echo_positions(job.prompt_token_ids, prompt)
    if request.logprobs is None:
        return text, None
    positions += lp.output_positions(output or ())
    return text, lp.completion_logprobs(positions, decoder.token, request.logprobs, text_offset)


def completion_response(
    request_id: str,
    request: CompletionRequest,
    jobs: list[Job],
    results: list[ChoiceResult],
    decoder: Decoder,
) -> Completion:
    choices = []
    for job, r in zip(jobs, results):
        text, logprobs = completion_text_and_logprobs(
            request, job, r.text, r.logprobs, r.prompt_logprobs, request.echo, decoder
        )
        choices.append(
            CompletionChoice(
                index=job.index,
                text=text,
                finish_reason=r.finish_reason or "stop",
                logprobs=logprobs,
                **r.extra,
            )
        )
    return Completion(
        id=request_id,
        object="text_completion",
        created=int(time.time()),
        model=request.model,
        choices=choices,
        usage=usage(jobs, sum(r.num_tokens for r in results)),
    )


def chat_logprobs(
    request: ChatCompletionRequest, entries: Sequence[TokenLogprob] | None, decoder: Decoder
) -> ChoiceLogprobs | None:
    if request.sample_logprobs is None:
        return None
    return lp.chat_logprobs(entries or (), decoder.token, request.sample_logprobs)


def chat_response(
    request_id: str,
    request: ChatCompletionRequest,
    jobs: list[Job],
    results: list[ChoiceResult],
    decoder: Decoder,
) -> ChatCompletion:
    choices = [
        ChatChoice(
            index=i,
            message=ChatCompletionMessage(role="assistant", content=r.text),
            finish_reason=r.finish_reason or "stop",
            logprobs=chat_logprobs(request, r.logprobs, decoder),
            **r.extra,
        )
        for i, r in enumerate(results)
    ]
    return ChatCompletion(
        id=request_id,
        object="chat.completion",
        created=int(time.time()),
        model=request.model,
        choices=choices,
        usage=usage(jobs, sum(r.num_tokens for r in results)),
    )


@dataclass
class CompletionStream:
    """A streamed completion's per-choice state: the prompt is echoed once, on a choice's first
    chunk, and text offsets continue from chunk to chunk."""

    request_id: str
    request: CompletionRequest
    decoder: Decoder
    echoed: set[int] = field(default_factory=set)
    offsets: dict[int, int] = field(default_factory=dict)

    def chunk(self, job: Job, delta: Delta) -> Completion:
        echo = self.request.echo and job.index not in self.echoed
        self.echoed.add(job.index)
        offset = self.offsets.get(job.index, 0)
        text, logprobs = completion_text_and_logprobs(
            self.request,
            job,
            delta.text,
            delta.logprobs,
            delta.prompt_logprobs,
            echo,
            self.decoder,
            offset,
        )
        self.offsets[job.index] = lp.next_text_offset(logprobs, offset)
        # model_construct: a streamed choice has no finish_reason until its last chunk, a null
        # the openai type does not declare (hence typed Any here).
        unfinished: dict[str, Any] = {"finish_reason": delta.finish_reason}
        choice = CompletionChoice.model_construct(
            index=job.index,
            text=text,
            **unfinished,
            logprobs=logprobs,
            **(delta.extra or {}),
        )
        return Completion.model_construct(
            id=self.request_id,
            object="text_completion",
            created=int(time.time()),
            model=self.request.model,
            choices=[choice],
        )


def chat_chunk(
    request_id: str,
    model: str,
    index: int,
    content: str | None,
    finish_reason: str | None,
    role: str | None = None,
    extra: dict | None = None,
    logprobs: ChoiceLogprobs | None = None,
) -> ChatCompletionChunk:
    chunk_logprobs = None if logprobs is None else ChunkLogprobs(content=logprobs.content)
    choice = ChunkChoice(
        index=index,
        delta=ChoiceDelta(role=role, content=content),
        finish_reason=finish_reason,
        logprobs=chunk_logprobs,
        **(extra or {}),
    )
    return ChatCompletionChunk(
        id=request_id,
        object="chat.completion.chunk",
        created=int(time.time()),
        model=model,
        choices=[choice],
    )


def usage_chunk(request_id: str, model: str, jobs: list[Job], completion_tokens: int) -> Completion:
    """The last streamed completion chunk when `stream_options.include_usage` is set."""
    return Completion.model_construct(
        id=request_id,
        object="text_completion",
        created=int(time.time()),
        model=model,
        choices=[],
        usage=usage(jobs, completion_tokens),
    )

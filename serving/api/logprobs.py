"""Engine logprobs as the `openai` package's logprobs objects, in the shapes vLLM's own servers
return (vllm/entrypoints/openai/completion/serving.py `_create_completion_logprobs`,
chat_completion/serving.py `_create_chat_logprobs`), so clients and lm-evaluation-harness read
the HF baseline and vLLM the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from openai.types.completion_choice import Logprobs as CompletionLogprobs

from serving.engines.base import TokenLogprob

# vLLM sends -inf as this JSON-safe number, as OpenAI does.
LOGPROB_FLOOR = -9999.0

DecodeToken = Callable[[int], str]
Position = tuple[int, TokenLogprob | None]  # a token id and its logprobs (None: not scored)


def clamp(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def ranked(entry: TokenLogprob) -> list[tuple[int, float]]:
    """vLLM's order for one position: the chosen token first, then the top k (a token that is
    both appears once, in the first place)."""
    return list(dict([(entry.token_id, entry.logprob), *entry.top]).items())


def token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def completion_logprobs(
    positions: Sequence[Position], decode: DecodeToken, num_top: int, text_offset: int = 0
) -> CompletionLogprobs:
    """Legacy completions logprobs: per token its text, logprob, `{token: logprob}` of the chosen
    token and the `num_top` most likely, and where its text starts. model_construct: an unscored
    position (the first prompt token) is null, which the openai type does not declare."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, entry in positions:
        token = decode(token_id)
        tokens.append(token)
        offsets.append(text_offset)
        text_offset += len(token)
        token_logprobs.append(None if entry is None else clamp(entry.logprob))
        top_logprobs.append(
            None
            if entry is None
            else {decode(t): clamp(lp) for t, lp in ranked(entry)[: num_top + 1]}
        )
    # Typed Any: the entries may be null, which the openai type's fields do not declare.
    nullable: dict[str, Any] = {"token_logprobs": token_logprobs, "top_logprobs": top_logprobs}
    return CompletionLogprobs.model_construct(tokens=tokens, **nullable, text_offset=offsets)


def next_text_offset(logprobs: CompletionLogprobs | None, current: int) -> int:
    """Where the next streamed chunk's text offsets start (advanced by the tokens reported)."""
    if logprobs is None or not logprobs.tokens:
        return current
    assert logprobs.text_offset is not None, "completion_logprobs() gives each token its offset"
    return logprobs.text_offset[-1] + len(logprobs.tokens[-1])


def chat_logprobs(
    entries: Sequence[TokenLogprob], decode: DecodeToken, num_top: int
) -> ChoiceLogprobs:
    """Chat logprobs: per token its text, bytes, logprob and the first `num_top` of vLLM's
    order as `top_logprobs`."""
    content = []
    for entry in entries:
        token = decode(entry.token_id)
        top = [
            TopLogprob(token=(alt := decode(t)), logprob=clamp(lp), bytes=token_bytes(alt))
            for t, lp in ranked(entry)[:num_top]
        ]
        content.append(
            ChatCompletionTokenLogprob(
                token=token,
                logprob=clamp(entry.logprob),
                bytes=token_bytes(token),
                top_logprobs=top,
            )
        )
    return ChoiceLogprobs(content=content)


def echo_positions(
    prompt_ids: Sequence[int], prompt_entries: Sequence[TokenLogprob | None] | None
) -> list[Position]:
    """The prompt's positions for an echoed completion (the first token is never scored)."""
    entries = list(prompt_entries) if prompt_entries else [None] * len(prompt_ids)
    return list(zip(prompt_ids, entries))


def output_positions(entries: Sequence[TokenLogprob]) -> list[Position]:
    return [(entry.token_id, entry) for entry in entries]

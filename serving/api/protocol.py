"""Request bodies of the OpenAI routes. Responses use the `openai` package's own types.

Unknown fields are rejected (400 naming the field), as the OpenAI API does, instead of being
silently ignored. `ignore_eos` and `min_tokens` are vLLM's extensions, passed with `extra_body`.
Every field vLLM's benchmark client (`vllm.benchmarks.serve`, backends `openai` and `openai-chat`)
sends is accepted, `"logprobs": null` and `repetition_penalty` included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Stop = str | Annotated[list[str], Field(max_length=8)] | None
# vLLM's default `max_logprobs`; OpenAI allows up to 20 top_logprobs too.
MAX_LOGPROBS = 20


def unencodable_path(value: Any, path: str = "") -> str | None:
    """Where a string that is not valid Unicode (a lone surrogate such as "\\ud800", which JSON
    allows) sits in a request; tokenizers fail on it with a 500 otherwise."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = unencodable_path(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class UnicodeRequest(BaseModel):
    """A request body whose strings must be valid Unicode (400 naming the field otherwise)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = unencodable_path(data)
        if where:
            raise ValueError(f"{where}: text must be valid Unicode (no lone surrogates)")
        return data


class SamplingRequest(UnicodeRequest):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate per choice.")
    # Sampling fields left out take the model's generation_config value, else the neutral one
    # (temperature 1, top_p 1, top_k off, penalties off), as `vllm serve` does.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # int32: the engine keeps top_k in an int32 tensor.
    top_k: int | None = Field(
        None, ge=-1, le=2**31 - 1, description="Extension (vLLM): -1 or 0 = every token."
    )
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="Extension (vLLM).")
    # Bounded where sampling stays finite: logits divided by a tiny penalty overflow to inf.
    repetition_penalty: float | None = Field(
        None, ge=0.01, le=10.0, description="Extension (vLLM): > 1 discourages repeats."
    )
    n: int = Field(1, ge=1, description="Choices per prompt (at most `limits.max_n`).")
    stop: Stop = None
    # int64, as OpenAI documents it: torch and vLLM seed generators overflow beyond it.
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = Field(False, description="Extension: keep generating past EOS.")
    min_tokens: int = Field(0, ge=0, description="Extension: generate at least this many tokens.")
    mode: str | None = Field(
        None, max_length=32, description="Extension: engine-specific generation mode (HF baseline)."
    )
    timings: bool = Field(
        False, description="Extension: return per-token timings (time to first token, gaps)."
    )

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [stop for stop in stops if stop]  # "" stops nothing (and vLLM rejects it: a 500)

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def sample_logprobs(self) -> int | None:
        """Top alternatives per generated token (0: the chosen token only); None: no logprobs."""
        return None

    @property
    def prompt_logprobs(self) -> int | None:
        """The same for each prompt token (completions' echo); None: none."""
        return None


# At most `limits.max_prompts_per_request` prompts (checked with the config's limits).
PromptBatch = Annotated[list[str], Field(min_length=1)]
TokenBatch = Annotated[list[list[int]], Field(min_length=1)]


class CompletionRequest(SamplingRequest):
    # A list of token-id lists is a batch of pre-tokenized prompts (lm-evaluation-harness sends it).
    prompt: str | PromptBatch | list[int] | TokenBatch
    echo: bool = Field(False, description="Return the prompt before the completion.")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="Logprobs of each token plus this many most likely (legacy completions shape); "
        "with echo, of the prompt's tokens too.",
    )

    @property
    def sample_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None  # as vLLM: echo + logprobs scores the prompt

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, prompt: str | list) -> str | list:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("prompt must not be empty")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """The batch: one entry per prompt (a list of ints is one pre-tokenized prompt)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        # pydantic validated the list as one of the union's list types, so all ints is `list[int]`.
        if all(isinstance(item, int) for item in self.prompt):
            return [list(cast(list[int], self.prompt))]
        return list(cast(list[str] | list[list[int]], self.prompt))

    def prompt_text(self, index: int, decode: Callable[[list[int]], str]) -> str:
        """The text of one prompt of the batch, as echo returns it (token ids are decoded)."""
        prompt = self.prompts()[index]
        return prompt if isinstance(prompt, str) else decode(prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=256)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(False, description="Return each output token's logprob.")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Most likely tokens per position (needs logprobs)."
    )

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:  # vLLM's and OpenAI's rule
            raise ValueError(
                "top_logprobs: when using `top_logprobs`, `logprobs` must be set to true"
            )
        return self

    @property
    def sample_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

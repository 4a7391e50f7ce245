"""A deterministic in-memory engine for unit tests of the API layer (no model, no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from serving.engines.base import Delta, EngineStats, SamplingSpec, TokenLogprob

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


class WordTokenizer:
    """Whitespace tokenizer with a chat template: enough to count prompt tokens."""

    vocab = {word: i for i, word in enumerate(["<pad>", *WORDS, "user:", "assistant:"])}

    def __len__(self) -> int:
        return 1000

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [self.vocab.get(w, 999) for w in text.split()]}

    def decode(self, token_ids: list[int]) -> str:
        words = {i: word for word, i in self.vocab.items()}
        return "".join(f" {words.get(i, f'<{i}>')}" for i in token_ids)

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        text = " ".join(f"{m['role']}: {m['content']}" for m in messages) + " assistant:"
        return self(text)["input_ids"]


def fake_logprob(token_id: int, position: int, k: int) -> TokenLogprob:
    """Made-up but deterministic: the token at -0.5 - position/10, and k other tokens (ids 100+)
    ranked above it, as a sampled token can be: vLLM's chosen-first order then shows."""
    top = tuple((100 + j, -0.1 * (j + 1)) for j in range(k))
    return TokenLogprob(token_id, -0.5 - position / 10, top)


class FakeEngine:
    model_name = "fake-model"
    supports_logprobs = True
    max_model_len = 64
    modes: tuple[str, ...] = ("fast",)
    startup_timings: dict[str, float] = {}
    sampling_defaults: dict[str, float] = {}

    def __init__(self, delay_s: float = 0.0) -> None:
        self.tokenizer = WordTokenizer()
        self.delay_s = delay_s
        self.started: list[str] = []
        self.sampled: list[SamplingSpec] = []  # what each request asked the engine for
        self.aborted: list[str] = []
        self.running = 0

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec
    ) -> AsyncIterator[Delta]:
        self.started.append(request_id)
        self.sampled.append(sampling)
        self.running += 1
        offset = (sampling.seed or 0) + len(prompt_token_ids)
        try:
            text = ""
            for i in range(sampling.max_tokens):
                await asyncio.sleep(self.delay_s)
                word = f" {WORDS[(offset + i) % len(WORDS)]}"
                if any(stop in text + word for stop in sampling.stop):
                    yield Delta(text="", num_tokens=0, finish_reason="stop")
                    return
                text += word
                last = i == sampling.max_tokens - 1
                extra = {"timings": {"ttft_ms": 1.0}} if last and sampling.timings else None
                yield Delta(
                    word,
                    1,
                    "length" if last else None,
                    extra,
                    logprobs=self._logprobs(word, i, sampling),
                    prompt_logprobs=self._prompt_logprobs(prompt_token_ids, i, sampling),
                )
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise
        finally:
            self.running -= 1

    def _logprobs(
        self, word: str, i: int, sampling: SamplingSpec
    ) -> tuple[TokenLogprob, ...] | None:
        if sampling.logprobs is None:
            return None
        token_id = self.tokenizer.vocab[word.strip()]
        return (fake_logprob(token_id, i, sampling.logprobs),)

    def _prompt_logprobs(
        self, prompt: list[int], i: int, sampling: SamplingSpec
    ) -> tuple[TokenLogprob | None, ...] | None:
        if sampling.prompt_logprobs is None or i > 0:  # sent once, with the first delta
            return None
        scored = [fake_logprob(t, p, sampling.prompt_logprobs) for p, t in enumerate(prompt)]
        return (None, *scored[1:])

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(running=self.running, waiting=0, aborted_total=len(self.aborted))

    async def check_health(self) -> None:
        return None

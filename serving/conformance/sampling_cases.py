"""One case per sampling field. Each checks a property that holds for any model, random weights
included: a field that narrows sampling to the top token must reproduce greedy decoding, a bias
of +100 must force its token, a length bound must bound the usage count."""

from __future__ import annotations

from openai import Omit, omit
from openai.types import Completion, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from serving.conformance.context import CaseContext, expect, expect_present

PROMPT = "The capital of France is"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 8
# Any vocabulary has it; what it decodes to does not matter, only that it repeats.
BIASED_TOKEN_ID = 100


def complete(ctx: CaseContext, **fields) -> Completion:
    """One /v1/completions request; fields the openai client has no argument for go in extra_body."""
    fields.setdefault("max_tokens", MAX_TOKENS)
    return ctx.client.completions.create(model=ctx.model, prompt=PROMPT, **fields)


def usage_of(out: Completion | ChatCompletion) -> CompletionUsage:
    return expect_present(out.usage, "no usage in the response")


def greedy_text(ctx: CaseContext) -> str:
    return complete(ctx, temperature=0).choices[0].text


def expect_same_as_greedy(ctx: CaseContext, field: str, **fields) -> None:
    text = complete(ctx, **fields).choices[0].text
    expect(text == greedy_text(ctx), f"{field} did not reduce sampling to the top token: {text!r}")


def expect_bounded(completion_tokens: int, finish_reason: str | None, limit: int) -> None:
    expect(completion_tokens <= limit, f"{completion_tokens} tokens for a limit of {limit}")
    if finish_reason == "length":
        expect(
            completion_tokens == limit, f"finish_reason length after {completion_tokens}/{limit}"
        )


def case_temperature(ctx: CaseContext) -> None:
    first, second = greedy_text(ctx), greedy_text(ctx)
    expect(first == second, f"temperature 0 is not deterministic: {first!r} vs {second!r}")


def case_top_k(ctx: CaseContext) -> None:
    expect_same_as_greedy(ctx, "top_k=1", temperature=1.0, extra_body={"top_k": 1})


def case_top_p(ctx: CaseContext) -> None:
    expect_same_as_greedy(ctx, "top_p=1e-9", temperature=1.0, top_p=1e-9)


def case_min_p(ctx: CaseContext) -> None:
    # min_p 1: only tokens as likely as the most likely one survive.
    expect_same_as_greedy(ctx, "min_p=1", temperature=1.0, extra_body={"min_p": 1.0})


def case_repetition_penalty(ctx: CaseContext) -> None:
    out = complete(ctx, temperature=0, extra_body={"repetition_penalty": 1.3})
    expect_bounded(usage_of(out).completion_tokens, out.choices[0].finish_reason, MAX_TOKENS)


def chat_penalty_case(
    ctx: CaseContext, presence_penalty: float | Omit = omit, frequency_penalty: float | Omit = omit
) -> None:
    out = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=CHAT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
    )
    expect_bounded(usage_of(out).completion_tokens, out.choices[0].finish_reason, MAX_TOKENS)


def case_presence_penalty(ctx: CaseContext) -> None:
    chat_penalty_case(ctx, presence_penalty=1.5)


def case_frequency_penalty(ctx: CaseContext) -> None:
    chat_penalty_case(ctx, frequency_penalty=1.5)


def case_logit_bias(ctx: CaseContext) -> None:
    out = complete(ctx, temperature=0, max_tokens=4, logit_bias={str(BIASED_TOKEN_ID): 100})
    text = out.choices[0].text
    piece = text[: len(text) // 4]
    expect(bool(piece) and text == piece * 4, f"+100 bias did not force one token: {text!r}")


def case_max_tokens(ctx: CaseContext) -> None:
    out = complete(ctx, max_tokens=3)
    expect_bounded(usage_of(out).completion_tokens, out.choices[0].finish_reason, 3)


def case_max_completion_tokens(ctx: CaseContext) -> None:
    out = ctx.client.chat.completions.create(
        model=ctx.model, messages=CHAT, max_completion_tokens=3
    )
    expect_bounded(usage_of(out).completion_tokens, out.choices[0].finish_reason, 3)


def case_min_tokens(ctx: CaseContext) -> None:
    tokens = usage_of(complete(ctx, max_tokens=6, extra_body={"min_tokens": 6})).completion_tokens
    expect(tokens == 6, f"{tokens} tokens, min_tokens 6")


def case_ignore_eos(ctx: CaseContext) -> None:
    out = complete(ctx, max_tokens=6, extra_body={"ignore_eos": True})
    tokens = usage_of(out).completion_tokens
    expect(tokens == 6, f"{tokens} tokens of 6 with ignore_eos")
    expect(
        out.choices[0].finish_reason == "length", f"finish_reason {out.choices[0].finish_reason}"
    )


def case_seed(ctx: CaseContext) -> None:
    first, second = (complete(ctx, temperature=1.0, seed=1234).choices[0].text for _ in range(2))
    expect(first == second, f"same seed, different samples: {first!r} vs {second!r}")


def case_n(ctx: CaseContext) -> None:
    out = ctx.client.chat.completions.create(
        model=ctx.model, messages=CHAT, max_tokens=4, n=2, temperature=1.0
    )
    indices = sorted(choice.index for choice in out.choices)
    expect(indices == [0, 1], f"n=2 gave choices {indices}")


def case_stop(ctx: CaseContext) -> None:
    full = greedy_text(ctx)
    later = [char for char in full[1:] if not char.isspace()]
    expect(bool(later), f"greedy output too short to pick a stop string: {full!r}")
    stop = later[0]  # a character the greedy output is known to contain
    out = complete(ctx, temperature=0, stop=[stop]).choices[0]
    expected = full[: full.index(stop)]
    expect(out.text == expected, f"stop {stop!r}: got {out.text!r}, expected {expected!r}")
    expect(out.finish_reason == "stop", f"finish_reason {out.finish_reason} at a stop string")


SAMPLING_CASES = {
    "temperature (0 = greedy, deterministic)": case_temperature,
    "top_k (1 = greedy)": case_top_k,
    "top_p (tiny = greedy)": case_top_p,
    "min_p (1 = greedy)": case_min_p,
    "repetition_penalty": case_repetition_penalty,
    "presence_penalty": case_presence_penalty,
    "frequency_penalty": case_frequency_penalty,
    "logit_bias (+100 forces the token)": case_logit_bias,
    "max_tokens": case_max_tokens,
    "max_completion_tokens (chat)": case_max_completion_tokens,
    "min_tokens": case_min_tokens,
    "ignore_eos": case_ignore_eos,
    "seed (same seed, same sample)": case_seed,
    "n=2": case_n,
    "stop strings": case_stop,
}

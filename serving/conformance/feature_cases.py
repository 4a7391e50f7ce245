"""Cases for the API features beyond sampling: logprobs, echo, streaming with usage, structured
outputs, tools, the Responses API. Structured outputs and tool arguments are enforced by guided
decoding, so they must parse for any model, random weights included."""

from __future__ import annotations

import json

import pydantic
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallParam,
)

from serving.conformance.context import CaseContext, expect, expect_present
from serving.conformance.sampling_cases import CHAT, MAX_TOKENS, PROMPT, complete, usage_of

# Room for a small JSON object; a model that has not closed it by then fails the case.
JSON_MAX_TOKENS = 128
# Random weights pick the whitespace a JSON grammar allows between tokens over and over; a
# penalty on repeats walks them out of it (measured: 61 tokens instead of running to the limit).
JSON_FREQUENCY_PENALTY = 2.0
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        # Asks for arguments that follow the schema: vLLM 0.32 constrains tool arguments to the
        # schema only for `strict` tools (its default --tool-strict-level auto); without it the
        # default model answered `"Paris"` instead of {"city": "Paris"}.
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
WEATHER_QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]


class Answer(pydantic.BaseModel):
    ok: bool


def case_chat_logprobs(ctx: CaseContext) -> None:
    out = ctx.client.chat.completions.create(
        model=ctx.model, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = (out.choices[0].logprobs and out.choices[0].logprobs.content) or []
    tokens = usage_of(out).completion_tokens
    expect(len(entries) == tokens, f"{len(entries)} logprobs for {tokens} tokens")
    for entry in entries:
        expect(len(entry.top_logprobs) == 3, f"{len(entry.top_logprobs)} top_logprobs, asked 3")
        expect(entry.logprob <= 0, f"logprob {entry.logprob} > 0")
        # Greedy: the chosen token is the most likely one.
        expect(
            entry.token == entry.top_logprobs[0].token,
            f"greedy token {entry.token!r} is not the top one {entry.top_logprobs[0].token!r}",
        )


def case_completion_logprobs(ctx: CaseContext) -> None:
    out = complete(ctx, max_tokens=4, temperature=0, logprobs=2)
    logprobs = expect_present(out.choices[0].logprobs, "no logprobs in the choice")
    tokens = expect_present(logprobs.tokens, "no logprobs in the choice")
    values = expect_present(logprobs.token_logprobs, "no token_logprobs in the choice")
    count = usage_of(out).completion_tokens
    expect(len(tokens) == count, f"{len(tokens)} logprobs for {count} tokens")
    expect(all(value <= 0 for value in values), "a token logprob > 0")
    expect(
        all(len(top) >= 2 for top in logprobs.top_logprobs or []) and bool(logprobs.top_logprobs),
        "fewer than 2 top_logprobs per token",
    )


def case_echo_prompt_logprobs(ctx: CaseContext) -> None:
    # What lm-evaluation-harness' local-completions sends to score a continuation.
    out = complete(ctx, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice, usage = out.choices[0], usage_of(out)
    expect(choice.text.startswith(PROMPT), f"echo did not return the prompt: {choice.text[:40]!r}")
    values = (choice.logprobs and choice.logprobs.token_logprobs) or []
    expect(
        len(values) == usage.prompt_tokens + usage.completion_tokens,
        f"{len(values)} logprobs for {usage.prompt_tokens}+{usage.completion_tokens} tokens",
    )
    expect(values[0] is None, f"first prompt token logprob {values[0]!r}, expected None")
    expect(all(isinstance(v, float) for v in values[1:]), "a prompt token without a logprob")


def expect_stream_usage(chunks: list, text: str) -> None:
    expect(bool(chunks), "empty stream")
    last = chunks[-1]
    expect(last.usage is not None, "no usage chunk at the end of the stream")
    expect(not last.choices, "the usage chunk carries choices")
    expect(
        last.usage.completion_tokens >= 1, f"usage.completion_tokens {last.usage.completion_tokens}"
    )
    expect(all(chunk.usage is None for chunk in chunks[:-1]), "usage before the last chunk")
    expect(isinstance(text, str), "no text streamed")


def case_stream_chat_usage(ctx: CaseContext) -> None:
    stream = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=CHAT,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expect_stream_usage(chunks, text)


def case_stream_completion_usage(ctx: CaseContext) -> None:
    stream = ctx.client.completions.create(
        model=ctx.model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    expect_stream_usage(chunks, text)


def case_json_object(ctx: CaseContext) -> None:
    out = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
        max_tokens=JSON_MAX_TOKENS,
        temperature=0,
        frequency_penalty=JSON_FREQUENCY_PENALTY,
    )
    content, finish_reason = out.choices[0].message.content or "", out.choices[0].finish_reason
    expect(parses_as_json(content), f"not JSON (finish_reason {finish_reason}): {content[:40]!r}")


def parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def case_json_schema_parse(ctx: CaseContext) -> None:
    out = ctx.client.chat.completions.parse(
        model=ctx.model,
        messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
        response_format=Answer,
        max_tokens=JSON_MAX_TOKENS,
        temperature=0,
        frequency_penalty=JSON_FREQUENCY_PENALTY,
    )
    parsed = out.choices[0].message.parsed
    expect(isinstance(parsed, Answer), f"parsed is {parsed!r}")


def expect_weather_calls(message) -> None:
    calls = message.tool_calls or []
    expect(bool(calls), f"no tool_calls (content {(message.content or '')[:40]!r})")
    for call in calls:
        expect(call.function.name == "get_weather", f"tool {call.function.name!r}")
        arguments = call.function.arguments
        expect(
            parses_as_json(arguments) and isinstance(json.loads(arguments), dict),
            f"arguments not a JSON object: {arguments[:40]!r}",
        )


def tool_request(ctx: CaseContext, tool_choice):
    return ctx.client.chat.completions.create(
        model=ctx.model,
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        max_tokens=JSON_MAX_TOKENS,
        temperature=0,
    )


def case_named_tool_choice(ctx: CaseContext) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    expect_weather_calls(tool_request(ctx, named).choices[0].message)


def case_required_tool_choice(ctx: CaseContext) -> None:
    expect_weather_calls(tool_request(ctx, "required").choices[0].message)


def case_tool_message(ctx: CaseContext) -> None:
    call: ChatCompletionMessageToolCallParam = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
    }
    messages: list[ChatCompletionMessageParam] = [
        *WEATHER_QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    out = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    expect(
        len(out.choices) == 1 and out.choices[0].message.role == "assistant", "no assistant reply"
    )


def case_responses(ctx: CaseContext) -> None:
    out = ctx.client.responses.create(model=ctx.model, input="Say hello.", max_output_tokens=16)
    kinds = [item.type for item in out.output]
    expect("message" in kinds, f"no message in the output: {kinds}")
    expect(isinstance(out.output_text, str), "no output_text")
    expect(out.status in ("completed", "incomplete"), f"status {out.status}")


FEATURE_CASES = {
    "logprobs + top_logprobs (chat)": case_chat_logprobs,
    "logprobs (completions)": case_completion_logprobs,
    "echo + prompt logprobs": case_echo_prompt_logprobs,
    "stream + include_usage (chat)": case_stream_chat_usage,
    "stream + include_usage (completions)": case_stream_completion_usage,
    "response_format json_object": case_json_object,
    "response_format json_schema (parse)": case_json_schema_parse,
    "tool_choice named": case_named_tool_choice,
    "tool_choice required": case_required_tool_choice,
    "tool message in history": case_tool_message,
    "/v1/responses": case_responses,
}

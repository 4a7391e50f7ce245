"""Cases for the routes around generation (/v1/models, /tokenize, /detokenize) and for bad input:
each must get a 4xx in the OpenAI error shape, never a 5xx."""

from __future__ import annotations

from typing import Any, Protocol

import openai

from serving.conformance.context import CaseContext, expect
from serving.conformance.sampling_cases import CHAT

ROUND_TRIP_TEXT = "Hello world, 42 tokens!"
UNKNOWN_MODEL = "no-such-model-conformance"


def case_models(ctx: CaseContext) -> None:
    ids = [model.id for model in ctx.client.models.list()]
    expect(ctx.model in ids, f"{ctx.model!r} not in {ids}")


def case_tokenize_round_trip(ctx: CaseContext) -> None:
    tokenized = (
        ctx.http.post(
            "/tokenize",
            json={"model": ctx.model, "prompt": ROUND_TRIP_TEXT, "add_special_tokens": False},
        )
        .raise_for_status()
        .json()
    )
    tokens = tokenized.get("tokens")
    expect(isinstance(tokens, list) and len(tokens) > 0, f"no tokens: {tokenized}")
    expect(
        tokenized.get("count") == len(tokens), f"count {tokenized.get('count')} != {len(tokens)}"
    )
    text = (
        ctx.http.post("/detokenize", json={"model": ctx.model, "tokens": tokens})
        .raise_for_status()
        .json()
        .get("prompt")
    )
    expect(text == ROUND_TRIP_TEXT, f"round trip gave {text!r}")


class HTTPResponse(Protocol):
    """What a case reads of a response: from `ctx.http` (httpx) or an openai error (its client's
    own httpx build, a distinct type)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self, **kwargs: Any) -> Any: ...


def expect_openai_error(response: HTTPResponse, status: int) -> None:
    """`status` and a body {"error": {"message": str, "type": str, ...}}."""
    expect(response.status_code == status, f"status {response.status_code}, expected {status}")
    try:
        error = response.json().get("error")
    except ValueError:
        error = None
    expect(
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str),
        f"not an OpenAI error body: {response.text[:60]!r}",
    )


def expect_status_error(ctx: CaseContext, status: int, **request) -> None:
    """A chat request that must be refused with `status`."""
    try:
        ctx.client.chat.completions.create(**{"model": ctx.model, "messages": CHAT, **request})
    except openai.APIStatusError as err:
        expect_openai_error(err.response, status)
        return
    expect(False, f"accepted, expected {status}")


def case_error_unknown_model(ctx: CaseContext) -> None:
    expect_status_error(ctx, 404, model=UNKNOWN_MODEL, max_tokens=2)


def case_error_max_tokens_zero(ctx: CaseContext) -> None:
    expect_status_error(ctx, 400, max_tokens=0)


def case_error_wrong_type(ctx: CaseContext) -> None:
    expect_status_error(ctx, 400, max_tokens=2, extra_body={"temperature": "hot"})


def case_error_malformed_json(ctx: CaseContext) -> None:
    response = ctx.http.post(
        "/v1/chat/completions", content=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    expect_openai_error(response, 400)


ROUTE_CASES = {
    "/v1/models lists the model": case_models,
    "/tokenize -> /detokenize round trip": case_tokenize_round_trip,
    "error: unknown model -> 404": case_error_unknown_model,
    "error: max_tokens 0 -> 400": case_error_max_tokens_zero,
    "error: wrong field type -> 400": case_error_wrong_type,
    "error: malformed JSON -> 400": case_error_malformed_json,
}

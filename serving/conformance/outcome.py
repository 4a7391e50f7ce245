"""What one case ended with: ok, fails (with a short reason) or not offered (the server does not
have the route or says it does not support the field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import httpx
import openai

Status = Literal["ok", "fails", "not offered"]
OK: Status = "ok"
FAILS: Status = "fails"
NOT_OFFERED: Status = "not offered"
REASON_CHARS = 90
# A route the server does not mount: 404 (no such path), 405 (path without that method), 501.
ROUTE_MISSING_STATUSES = frozenset({404, 405, 501})
# How servers say a request field is not theirs: vLLM ("... is not supported"), pydantic with
# extra="forbid" ("Extra inputs are not permitted"), this platform ("unrecognized request argument").
UNSUPPORTED_MARKERS = (
    "not supported",
    "unsupported",
    "unrecognized",
    "unknown field",
    "unknown parameter",
    "extra inputs are not permitted",
    "extra_forbidden",
    "not implemented",
)


class CaseFailed(AssertionError):
    """A case's own check did not hold; the message is the reason shown in the table."""


@dataclass(frozen=True)
class Outcome:
    status: Status
    reason: str = ""

    @property
    def cell(self) -> str:
        return f"fails: {self.reason}" if self.status == FAILS else self.status


def short_reason(text: str) -> str:
    """One line of at most REASON_CHARS characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def classify_status(status: int, message: str) -> Outcome:
    """An HTTP error a case did not expect: a missing route or a refused field is `not offered`,
    anything else (a 400 for a supported field, any 5xx) `fails`."""
    reason = short_reason(f"{status}: {message}")
    if status in ROUTE_MISSING_STATUSES:
        return Outcome(NOT_OFFERED, reason)
    if status in (400, 422) and any(marker in message.lower() for marker in UNSUPPORTED_MARKERS):
        return Outcome(NOT_OFFERED, reason)
    return Outcome(FAILS, reason)


def api_error_message(err: openai.APIStatusError) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the raw body."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if body.get("detail"):
            return str(body["detail"])
    return err.response.text or err.message


def classify_exception(err: BaseException) -> Outcome:
    """What a case that raised ended with."""
    if isinstance(err, CaseFailed):
        return Outcome(FAILS, short_reason(str(err)))
    if isinstance(err, openai.APIStatusError):
        return classify_status(err.status_code, api_error_message(err))
    if isinstance(err, httpx.HTTPStatusError):
        return classify_status(err.response.status_code, err.response.text)
    if isinstance(err, (openai.APITimeoutError, httpx.TimeoutException)):
        return Outcome(FAILS, "timeout")
    if isinstance(err, openai.LengthFinishReasonError):
        return Outcome(FAILS, "hit max_tokens before the output was complete")
    if isinstance(err, (openai.APIConnectionError, httpx.TransportError)):
        return Outcome(FAILS, short_reason(f"connection: {err}"))
    return Outcome(FAILS, short_reason(f"{type(err).__name__}: {err}"))

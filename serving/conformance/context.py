"""What a case gets: an OpenAI client on the target's /v1, an HTTP client on its root (for
/tokenize, /detokenize and hand-made bodies) and the model name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import httpx
import openai

from serving.conformance.outcome import CaseFailed

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # an OpenAI base URL, ending in /v1

    @property
    def root(self) -> str:
        """The server root: vLLM mounts /tokenize and /detokenize there, not under /v1."""
        return self.url.removesuffix("/v1")


@dataclass(frozen=True)
class CaseContext:
    client: openai.OpenAI
    http: httpx.Client  # base_url = the target's root
    model: str


@contextmanager
def case_context(
    target: Target, model: str, api_key: str, timeout_s: float
) -> Iterator[CaseContext]:
    """Clients that never retry (a case is one try) and give up after timeout_s per request."""
    headers = {"Authorization": f"Bearer {api_key}"}
    client = openai.OpenAI(base_url=target.url, api_key=api_key, max_retries=0, timeout=timeout_s)
    with client, httpx.Client(base_url=target.root, headers=headers, timeout=timeout_s) as http:
        yield CaseContext(client, http, model)


def expect(condition: bool, reason: str) -> None:
    """A case's check: `reason` is what the table shows when it does not hold."""
    if not condition:
        raise CaseFailed(reason)


def expect_present(value: T | None, reason: str) -> T:
    """A field the response must carry: the value, or the case fails with `reason`."""
    if value is None:
        raise CaseFailed(reason)
    return value

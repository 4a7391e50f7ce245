"""Streaming completions read in background threads, each ending in one classified outcome, so a
fault test can hold streams open, break something, and see how every stream ended (bounded)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

READ_TIMEOUT_S = 30.0  # longer than the SSE ping (15 s): a live stream never trips it; a hang does


@dataclass
class StreamOutcome:
    kind: str  # completed | error_event | http_error | broken | truncated | timeout
    tokens: int = 0  # completion tokens (usage) or content chunks seen
    finish_reason: str | None = None
    detail: str = ""
    ended_at: float = 0.0  # time.monotonic()


class OpenStream:
    """POST a streaming request in a thread; `first_chunk` is set once text arrives."""

    def __init__(self, url: str, body: dict) -> None:
        self.url = url
        self.body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        self.first_chunk = threading.Event()
        self.outcome: StreamOutcome | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_S)
        try:
            with (
                httpx.Client(timeout=timeout) as client,
                client.stream("POST", self.url, json=self.body) as response,
            ):
                if response.status_code != 200:
                    response.read()
                    detail = f"{response.status_code} {response.text[:200]}"
                    self._end(StreamOutcome("http_error", detail=detail))
                    return
                self._end(self._read(response))
        except httpx.TimeoutException as err:
            self._end(StreamOutcome("timeout", detail=type(err).__name__))
        except httpx.HTTPError as err:
            self._end(StreamOutcome("broken", detail=f"{type(err).__name__}: {err}"[:200]))

    def _read(self, response: httpx.Response) -> StreamOutcome:
        outcome = StreamOutcome("truncated")  # until [DONE] arrives
        chunks = 0
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                outcome.kind = "completed" if outcome.kind == "truncated" else outcome.kind
                break
            event = json.loads(data)
            if "error" in event:
                outcome.kind, outcome.detail = "error_event", json.dumps(event["error"])[:200]
                continue
            for choice in event.get("choices") or []:
                chunks += 1
                self.first_chunk.set()
                outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
            if event.get("usage"):
                outcome.tokens = event["usage"]["completion_tokens"]
        outcome.tokens = outcome.tokens or chunks
        return outcome

    def _end(self, outcome: StreamOutcome) -> None:
        outcome.ended_at = time.monotonic()
        self.outcome = outcome
        self.first_chunk.set()  # wake anyone waiting for a stream that failed before any text

    def wait(self, timeout_s: float) -> StreamOutcome:
        self._thread.join(timeout_s)
        return self.outcome or StreamOutcome("timeout", detail="reader still running")


def open_streams(url: str, body: dict, count: int, timeout_s: float = 120) -> list[OpenStream]:
    """`count` streams, returned once each has produced text (or ended)."""
    streams = [OpenStream(url, body) for _ in range(count)]
    deadline = time.monotonic() + timeout_s
    for stream in streams:
        assert stream.first_chunk.wait(max(0.0, deadline - time.monotonic())), "no first chunk"
    return streams


def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float) -> float | None:
    """Seconds until `condition()` first held (polled), or None after `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(poll_s)
    return None

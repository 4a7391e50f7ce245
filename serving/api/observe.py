"""Per-request latency and token metrics, measured where the deltas leave the engine, and the
response status count, measured where the headers leave the app."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.generation import Job
from serving.engines.base import Delta
from serving.metrics import PlatformMetrics


async def observed(
    stream: AsyncIterator[tuple[Job, Delta]],
    jobs: list[Job],
    metrics: PlatformMetrics | None,
    arrived: float,
) -> AsyncIterator[tuple[Job, Delta]]:
    """Pass deltas through, recording TTFT, inter-token gaps, e2e latency and token counts."""
    if metrics is None:
        async for item in stream:
            yield item
        return
    last_output: dict[int, float] = {}
    output_tokens = 0
    try:
        async for job, delta in stream:
            now = time.perf_counter()
            previous = last_output.get(job.index)
            if previous is None:
                metrics.record_first_token(now - arrived)
            elif delta.num_tokens:
                metrics.record_inter_token((now - previous) / delta.num_tokens)
            last_output[job.index] = now
            output_tokens += delta.num_tokens
            yield job, delta
    finally:
        prompt_tokens = sum(len(j.prompt_token_ids) for j in jobs if j.choice == 0)
        metrics.record_request(prompt_tokens, output_tokens, time.perf_counter() - arrived)


class StatusCounter:
    """ASGI middleware counting responses by status when their headers go out. Plain ASGI, not
    BaseHTTPMiddleware, so streams and client-disconnect cancellation pass through untouched."""

    def __init__(self, app: ASGIApp, metrics: PlatformMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.record_status(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)

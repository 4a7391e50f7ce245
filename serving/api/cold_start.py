"""Requests held while a model's deployment has no replica to take them (scaled to zero, or
every slot busy): bounded by the model's backpressure settings. Serve's handle holds them in its
queue (max_queued_requests: a full queue raises BackPressureError at once) and has no limit on how
long one waits there; `held` adds that limit (backpressure.max_queue_wait_s)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from serving.api.errors import APIError


class QueueWaitExceeded(Exception):
    """A request waited max_queue_wait_s for a replica and was taken out of Serve's queue."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"no replica took the request within {wait_s:g} s")
        self.wait_s = wait_s


def retry_after(seconds: float) -> dict[str, str]:
    """The Retry-After header: whole seconds, rounded up (RFC 9110 delay-seconds), as Serve's."""
    return {"Retry-After": str(max(0, -int(-seconds // 1)))}


def refusal(model: str, status: int, retry_after_s: float, err: Exception) -> APIError:
    """A full queue or a wait over the limit: the model's backpressure answer (503 or 429)."""
    if isinstance(err, QueueWaitExceeded):
        why, code = f"waited {err.wait_s:g} s for a replica (cold start)", "queue_wait_exceeded"
    else:
        why, code = "is at capacity (backpressure)", "queue_full"
    return APIError(
        f"model {model} {why}; retry after {retry_after_s:g} s",
        status=status,
        code=code,
        headers=retry_after(retry_after_s),
    )


async def held(response: Any, wait_s: float | None) -> AsyncIterator[Any]:
    """A Serve handle's streaming response, once a replica took it within `wait_s` seconds
    (None: however long it takes). The wait covers Serve's queue only, not the generation: a
    request over it is cancelled in the queue (it never reaches a replica) and raises
    QueueWaitExceeded; a full queue raises Serve's BackPressureError here."""
    if wait_s is not None:
        # The assignment future: Serve's public API offers no other way to await only the queue.
        assigned = response._fetch_future_result_async()
        try:
            await asyncio.wait_for(assigned, wait_s)
        except TimeoutError:
            response.cancel()
            raise QueueWaitExceeded(wait_s) from None
    async for item in response:
        yield item

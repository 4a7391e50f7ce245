"""The Batch API's runner, one in every vLLM replica: it claims lines of running batches for the
models the replica serves, runs each through the replica's own OpenAI app at vLLM's batch
priority, and stores its one result; it fills the engine only up to `concurrency` requests,
online ones included, so a batch takes idle capacity.
It beats its owner id so that the lines of a replica that died go back to the others (the
store's claims), and the runner that sees a batch's last line done ends the batch.

It knows nothing of engines or HTTP: the replica gives it callables (`RunRequest`, `in_engine`,
`prepare`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from openai.types import Batch

from serving.config.access import DEFAULT_TENANT, TenantConfig
from serving.state.batch_lines import dump, output_line
from serving.state.batches import RUNNING, BatchAPIError, Batches
from serving.state.line_store import OWNER_STALE_S, Line
from serving.state.tenancy import Principal, current_principal

logger = logging.getLogger(__name__)

# Runs one request (url, JSON body) through the replica's app: (status, JSON body, request id).
RunRequest = Callable[[str, dict[str, Any]], Awaitable[tuple[int, Any, str]]]

BEAT_S = OWNER_STALE_S / 5
POLL_S = 1.0  # how often an idle runner looks for running batches
# A finalizing batch whose runner died is finalized again by another after this long.
FINALIZE_STALE_S = 4 * OWNER_STALE_S
# A batch still validating this long after it was created lost the replica validating it.
VALIDATION_STALE_S = 600.0
# A cancelling batch ends when its lines in flight are done, or after this long (their runner died).
CANCEL_GRACE_S = 4 * OWNER_STALE_S


def line_body(request: dict[str, Any], priority: int) -> dict[str, Any]:
    """A line's request body as the replica runs it: below online requests, never streamed
    (an embeddings request has no `stream`)."""
    body = {**request["body"], "priority": priority}
    return body if request["url"] == "/v1/embeddings" else {**body, "stream": False}


def failed_request(err: Exception) -> tuple[int, Any, str]:
    """A line whose run raised (an adapter that would not load, an engine failure)."""
    message = f"the request failed in the replica ({type(err).__name__}: {err})"
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return 500, body, ""


class BatchRunner:
    def __init__(
        self,
        batches: Batches,
        owner: str,
        models: Callable[[], set[str]],
        run: RunRequest,
        in_engine: Callable[[], int],
        prepare: Callable[[str], Awaitable[Any]] | None = None,
    ) -> None:
        self.batches = batches
        self.store = batches.store
        self.owner = owner
        self.models = models  # the names this replica serves: its model and its adapters
        self.run = run
        # Requests in the replica's engine now (online and this runner's lines): the batch fills
        # the engine up to `concurrency` requests and each online request takes one of those
        # slots back, so online traffic at or above it runs alone (a CPU engine's step time grows
        # with every sequence: beside 4 online streams, 4 batch lines doubled their TTFT).
        self.in_engine = in_engine
        self.prepare = prepare  # e.g. load an adapter before its line runs
        self.concurrency = batches.settings.concurrency
        self.priority = batches.settings.priority
        self.held: dict[asyncio.Task[None], Line] = {}
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self.beat()), asyncio.create_task(self.loop())]

    def stop(self) -> None:
        """Stop at once: lines in flight go back to the others (released), unfinished."""
        for task in [*self.tasks, *self.held]:
            task.cancel()
        for line in self.held.values():
            with contextlib.suppress(Exception):
                self.store.release(line.batch_id, line.line, self.owner)
        self.held.clear()

    async def beat(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a store outage: the next beat tries again
                await asyncio.to_thread(self.store.beat, self.owner)
            await asyncio.sleep(BEAT_S)

    async def loop(self) -> None:
        beaten = False
        while True:
            self.wake.clear()  # before the step: a line that ends during it wakes the next one
            try:
                if not beaten:  # before the first claim: an owner never seen holds nothing
                    await asyncio.to_thread(self.store.beat, self.owner)
                    beaten = True
                await self.step()
            except Exception:  # the store was unreachable or a batch vanished: try again later
                logger.exception("batch runner step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL_S)

    async def step(self) -> None:
        for id in await asyncio.to_thread(self.store.ids_tagged, "batch", RUNNING):
            try:
                batch = await asyncio.to_thread(self.batches.stored, id)
            except BatchAPIError:
                continue  # deleted or evicted since
            await self.advance(batch)

    async def advance(self, batch: Batch) -> None:
        now = time.time()
        if batch.status == "in_progress":
            if batch.expires_at is not None and now >= batch.expires_at:
                await asyncio.to_thread(self.batches.finalize, batch, True)
                return
            await self.fill(batch)
            counts = await asyncio.to_thread(self.store.line_counts, batch.id)
            if counts["pending"] == 0 and counts["claimed"] == 0:
                await asyncio.to_thread(self.batches.finalize, batch)
        elif batch.status == "cancelling":
            counts = await asyncio.to_thread(self.store.line_counts, batch.id)
            waited = now - (batch.cancelling_at or now)
            if counts["claimed"] == 0 or waited > CANCEL_GRACE_S:
                await asyncio.to_thread(self.batches.end, batch, "cancelled", "cancelling")
        elif batch.status == "validating" and now - batch.created_at > VALIDATION_STALE_S:
            await asyncio.to_thread(self.batches.abandon, batch)
        elif batch.status == "finalizing" and now - (batch.finalizing_at or now) > FINALIZE_STALE_S:
            await asyncio.to_thread(self.batches.finish_finalizing, batch)

    async def fill(self, batch: Batch) -> None:
        """Claim and start lines of `batch` while the engine holds fewer than `concurrency`
        requests, online ones included."""
        free = self.concurrency - max(len(self.held), self.in_engine())
        if free <= 0:
            return
        claim = self.store.claim
        lines = await asyncio.to_thread(claim, batch.id, self.models(), self.owner, free)
        for line in lines:
            task = asyncio.create_task(self.run_line(line))
            self.held[task] = line
            task.add_done_callback(self.line_done)

    def line_done(self, task: asyncio.Task[None]) -> None:
        self.held.pop(task, None)
        self.wake.set()

    async def run_line(self, line: Line) -> None:
        request = json.loads(line.request)
        # The line runs as its batch's tenant (what it stores is theirs); its priority is the
        # platform's (line_body sets it), so the tenant's priority rule does not apply.
        tenant = await asyncio.to_thread(self.store.owner, "batch", line.batch_id)
        line_tenant = TenantConfig(name=tenant or DEFAULT_TENANT, may_set_priority=True)
        current_principal.set(Principal(line_tenant))
        try:
            if self.prepare is not None:
                await self.prepare(line.model)
            status, body, request_id = await self.run(
                request["url"], line_body(request, self.priority)
            )
        except asyncio.CancelledError:
            raise
        except Exception as err:
            status, body, request_id = failed_request(err)
        result = output_line(request["custom_id"], status, body, request_id)
        ok = 200 <= status < 300
        await asyncio.to_thread(self.store.finish, line.batch_id, line.line, ok, dump(result))

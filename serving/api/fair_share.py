"""Fair share of a saturated replica between tenants: when the engine already holds as many
requests as it schedules (its `max_num_seqs`, plus a little slack so it never waits for the next
one), a new request waits here, and each freed place goes to the waiting tenant that has been
served least, weighted by its share (`auth.tenants[].weight`), not to whoever came first.

Served is measured in tokens, a virtual token counter per tenant (as in "Fairness in Serving Large
Language Models", OSDI 2024): a request is charged an estimate of its prompt when it is admitted
(its body's bytes / 4) and its real prompt + output tokens when it ends. A tenant that was idle
starts at the lowest counter of the busy ones, so idleness banks no credit and its share goes to
the others meanwhile; of tenants served as much, the one with fewer requests admitted goes first.
Within a tenant, first come first served. Below saturation nothing waits."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict, deque
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.state.tenancy import current_principal

BYTES_PER_TOKEN = 4  # an admission estimate of a prompt from its body; corrected when it ends


def slack(capacity: int) -> int:
    """Requests past the engine's own batch let in, so it has the next one when a slot frees."""
    return max(2, capacity // 8)


class FairShare:
    """ASGI middleware below the key check and the tenant's limits."""

    def __init__(self, app: ASGIApp, capacity: int, weights: Mapping[str, float]) -> None:
        self.app = app
        self.capacity = capacity + slack(capacity)
        self.weights = dict(weights)
        self.running = 0
        self.active: Counter[str] = Counter()  # admitted, per tenant
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self.served: defaultdict[str, float] = defaultdict(float)  # tokens / weight (VTC)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = current_principal.get()
        if scope["type"] != "http" or scope["method"] != "POST" or principal is None:
            await self.app(scope, receive, send)
            return
        tenant = principal.tenant
        estimate = estimated_prompt(scope)
        await self.admit(tenant)
        self.charge(tenant, estimate)  # until the engine's counts arrive (UsageRecorder)
        try:
            await self.app(scope, receive, send)
        finally:
            self.charge(tenant, -estimate)
            self.release(tenant)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def charge(self, tenant: str, tokens: float) -> None:
        """Count tokens served to `tenant` (negative: an estimate corrected)."""
        self.served[tenant] += tokens / self.weight(tenant)

    def queued(self) -> int:
        return sum(len(queue) for queue in self.waiting.values())

    async def admit(self, tenant: str) -> None:
        if self.running < self.capacity and not self.queued():
            self.take(tenant)
            return
        self.catch_up(tenant)
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, deque()).append(place)
        try:
            await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():  # admitted as it was cancelled
                self.release(tenant)
            else:
                self.waiting[tenant].remove(place)
            raise

    def take(self, tenant: str) -> None:
        self.running += 1
        self.active[tenant] += 1

    def release(self, tenant: str) -> None:
        self.running -= 1
        self.active[tenant] -= 1
        self.dispatch()

    def dispatch(self) -> None:
        """Give free places to the waiting tenants served least."""
        while self.running < self.capacity:
            candidates = [tenant for tenant, queue in self.waiting.items() if queue]
            if not candidates:
                return
            # least served first; on a tie, the tenant with fewer requests admitted
            tenant = min(candidates, key=lambda name: (self.served[name], self.active[name]))
            place = self.waiting[tenant].popleft()
            if place.cancelled():
                continue
            self.take(tenant)
            place.set_result(None)

    def catch_up(self, tenant: str) -> None:
        """A tenant with nothing admitted or waiting starts no lower than the busy ones."""
        if self.active[tenant] or self.waiting.get(tenant):
            return
        busy = [
            self.served[other]
            for other in set(self.active) | set(self.waiting)
            if other != tenant and (self.active[other] or self.waiting.get(other))
        ]
        if busy:
            self.served[tenant] = max(self.served[tenant], min(busy))


def estimated_prompt(scope: Scope) -> int:
    length = Headers(scope=scope).get("content-length", "")
    return int(length) // BYTES_PER_TOKEN if length.isdigit() else 0

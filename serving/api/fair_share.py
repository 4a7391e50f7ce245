"""Fair share of a replica between tenants. While one tenant alone uses a replica, nothing
waits here below its `max_num_seqs` plus a little slack (so the engine has the next request when a
slot frees). While several are active, each may hold at most its weighted share of the engine's
`max_num_seqs` slots (at least one), so a burst of one tenant cannot take the slots another one
returns to within GRACE_S; and nothing beyond `max_num_seqs` is let in, so no request waits in the
engine's own first-come queue behind another tenant's. A free slot goes to the waiting tenant,
under its share, that has been served least, weighted by its share (`auth.tenants[].weight`).

Served is measured in tokens, a virtual token counter per tenant (as in "Fairness in Serving Large
Language Models", OSDI 2024): a request is charged an estimate of its prompt when it is admitted
(its body's bytes / 4) and its real prompt + output tokens when it ends. A tenant that was idle
starts at the lowest counter of the busy ones, so idleness banks no credit; of tenants served as
much, the one with fewer requests admitted goes first. Within a tenant, first come first served.
Slots a tenant leaves unused past GRACE_S go to the others (work-conserving)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.state.tenancy import current_principal

BYTES_PER_TOKEN = 4  # an admission estimate of a prompt from its body; corrected when it ends
GRACE_S = 1.0  # a tenant whose last request ended this recently is still active (closed loops)


def slack(capacity: int) -> int:
    """Requests past the engine's own batch let in while one tenant is active."""
    return max(2, capacity // 8)


class FairShare:
    """ASGI middleware below the key check and the tenant's limits."""

    def __init__(self, app: ASGIApp, capacity: int, weights: Mapping[str, float]) -> None:
        self.app = app
        self.slots = capacity  # the engine's max_num_seqs
        self.weights = dict(weights)
        self.running = 0
        self.active: Counter[str] = Counter()  # admitted, per tenant
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self.served: defaultdict[str, float] = defaultdict(float)  # tokens / weight (VTC)
        self.seen: dict[str, float] = {}  # when each tenant last had a request admitted or end
        self.recheck: asyncio.TimerHandle | None = None

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

    def busy(self, now: float) -> set[str]:
        """Tenants with requests admitted or waiting, or one ended within GRACE_S."""
        recent = {tenant for tenant, at in self.seen.items() if now - at < GRACE_S}
        return (
            recent
            | {t for t, n in self.active.items() if n}
            | {t for t, q in self.waiting.items() if q}
        )

    def capacity(self, now: float) -> int:
        """Requests let in at once: the engine's slots, plus slack while one tenant is busy."""
        return self.slots + slack(self.slots) if len(self.busy(now)) <= 1 else self.slots

    def share(self, tenant: str, now: float) -> int:
        """Most requests `tenant` may hold while the others busy hold theirs."""
        busy = self.busy(now) | {tenant}
        if len(busy) == 1:
            return self.capacity(now)
        total = sum(self.weight(other) for other in busy)
        return max(1, math.floor(self.slots * self.weight(tenant) / total))

    def may_take(self, tenant: str, now: float) -> bool:
        """A slot is free, and it is within the tenant's share or held for no other tenant."""
        capacity = self.capacity(now)
        if self.running >= capacity:
            return False
        if self.active[tenant] < self.share(tenant, now):
            return True
        busy = self.busy(now) - {tenant}
        held = sum(max(0, self.share(other, now) - self.active[other]) for other in busy)
        return self.running + held < capacity

    async def admit(self, tenant: str) -> None:
        self.catch_up(tenant)
        now = time.monotonic()
        if not self.queued() and self.may_take(tenant, now):
            self.take(tenant)
            return
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, deque()).append(place)
        self.dispatch()  # a slot may be free for this tenant though others wait over their share
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
        self.seen[tenant] = time.monotonic()

    def release(self, tenant: str) -> None:
        self.running -= 1
        self.active[tenant] -= 1
        self.seen[tenant] = time.monotonic()
        self.dispatch()

    def dispatch(self) -> None:
        """Give free places to the waiting tenants under their share, served least first; when a
        tenant's reserved slots may free up as its grace ends, look again then."""
        now = time.monotonic()
        while True:
            candidates = [t for t, queue in self.waiting.items() if queue and self.may_take(t, now)]
            if not candidates:
                if self.queued() and self.running < self.slots + slack(self.slots):
                    self.look_again(GRACE_S)
                return
            # least served first; on a tie, the tenant with fewer requests admitted
            tenant = min(candidates, key=lambda name: (self.served[name], self.active[name]))
            place = self.waiting[tenant].popleft()
            if place.cancelled():
                continue
            self.take(tenant)
            place.set_result(None)

    def look_again(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if self.recheck is None or self.recheck.when() <= loop.time():  # none pending
            self.recheck = loop.call_later(delay_s, self.dispatch)

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

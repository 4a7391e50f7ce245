"""Tenants' rate limits in the request path (auth.tenants[]: requests_per_minute,
tokens_per_minute, max_concurrent_requests), held across every replica by counters in the store
(serving/state/quota_store.py). A request over a limit is a 429 in the OpenAI shape naming it, with
Retry-After; every answer to a limited tenant carries OpenAI's `x-ratelimit-*` headers. Tokens are
the engine's own (prompt + output of each engine request, serving/api/usage.py), counted when the
request ends. A tenant without limits costs no store call."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import EXEMPT_PATHS, route_path
from serving.api.errors import APIError, error_response
from serving.config.access import TenantConfig
from serving.state.quota_store import INFLIGHT_REFRESH_S, WINDOW_S
from serving.state.store import Store
from serving.state.tenancy import current_principal


def reset_in(now: float) -> int:
    """Whole seconds until the current one-minute window ends (at least 1)."""
    return max(1, math.ceil(WINDOW_S - now % WINDOW_S))


def rate_headers(settings: TenantConfig, requests: int, tokens: int, now: float) -> dict[str, str]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} for the limits it has."""
    headers = {}
    reset = f"{reset_in(now)}s"
    for kind, limit, used in (
        ("requests", settings.requests_per_minute, requests),
        ("tokens", settings.tokens_per_minute, tokens),
    ):
        if limit is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


def over_limit(settings: TenantConfig, field: str, limit: int, retry_s: int) -> APIError:
    return APIError(
        f"tenant {settings.name} is at its limit auth.tenants[].{field}={limit}; retry in "
        f"{retry_s} s",
        status=429,
        code=f"{field}_exceeded",
        headers={"Retry-After": str(retry_s)},
        kind="rate_limit_exceeded",
    )


class TenantQuotas:
    """ASGI middleware below the API-key check: admits each request of a rate-limited tenant
    against the shared counters, and keeps this replica's in-flight count in the store."""

    def __init__(
        self, app: ASGIApp, store: Store, replica: str, refused: Callable[[str], None]
    ) -> None:
        self.app = app
        self.refused = refused  # counts a refusal for the tenant (the usage ledger)
        self.store = store
        self.replica = replica
        self.inflight: Counter[str] = Counter()  # this replica's, per tenant
        self.refresher: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = current_principal.get()
        if (
            scope["type"] != "http"
            or principal is None
            or not principal.settings.rate_limited
            or route_path(scope) in EXEMPT_PATHS
        ):
            await self.app(scope, receive, send)
            return
        settings = principal.settings
        refusal, headers = await asyncio.to_thread(self.admit, settings, time.time())
        if refusal is not None:
            self.refused(settings.name)
            refusal.headers = {**headers, **(refusal.headers or {})}
            await error_response(refusal)(scope, receive, send)
            return
        with self.holding(settings):
            await self.app(scope, receive, with_headers(send, headers))

    def admit(self, settings: TenantConfig, now: float) -> tuple[APIError | None, dict[str, str]]:
        """The refusal (None: admitted, its request counted) and the rate headers."""
        tenant = settings.name
        requests, tokens = self.store.window_counts(tenant, now)
        headers = rate_headers(settings, requests, tokens, now)
        if (limit := settings.max_concurrent_requests) is not None:
            held = self.inflight[tenant] + self.store.inflight_elsewhere(tenant, self.replica)
            if held >= limit:
                return over_limit(settings, "max_concurrent_requests", limit, 1), headers
        if (limit := settings.tokens_per_minute) is not None and tokens >= limit:
            return over_limit(settings, "tokens_per_minute", limit, reset_in(now)), headers
        taken = self.store.take_request(tenant, now, settings.requests_per_minute)
        if taken is None:
            limit = settings.requests_per_minute or 0
            return over_limit(settings, "requests_per_minute", limit, reset_in(now)), headers
        return None, rate_headers(settings, taken, tokens, now)

    @contextlib.contextmanager
    def holding(self, settings: TenantConfig) -> Iterator[None]:
        """One request of the tenant in flight here, reported to the store while it runs."""
        if settings.max_concurrent_requests is None:
            yield
            return
        tenant = settings.name
        self.inflight[tenant] += 1
        self.report(tenant)
        if self.refresher is None or self.refresher.done():
            self.refresher = asyncio.create_task(self.refresh())
        try:
            yield
        finally:
            self.inflight[tenant] -= 1
            self.report(tenant)

    def report(self, tenant: str) -> None:
        count = self.inflight[tenant]
        asyncio.get_running_loop().run_in_executor(
            None, self.store.report_inflight, tenant, self.replica, count
        )

    async def refresh(self) -> None:
        """Keep this replica's rows fresh while it holds requests (a stale row is left out)."""
        while any(self.inflight.values()):
            await asyncio.sleep(INFLIGHT_REFRESH_S)
            for tenant, count in list(self.inflight.items()):
                await asyncio.to_thread(self.store.report_inflight, tenant, self.replica, count)


def with_headers(send: Send, headers: dict[str, str]) -> Send:
    """`send` that adds `headers` to the response's start."""
    if not headers:
        return send
    extra = [(name.encode(), value.encode()) for name, value in headers.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending

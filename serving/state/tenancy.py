"""Whose request this is: the principal the API-key check found (its tenant and what it may do),
carried in a context variable from the request's middleware down to the store, including into the
tasks a request starts (a background response) and the threads it hands store calls to
(`asyncio.to_thread` copies the context).

A request is confined to its tenant's records; the platform's own work (a batch runner's loop,
finalizing a batch, no request at all) has no principal and sees every tenant's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from serving.config.access import DEFAULT_TENANT, TenantConfig


@dataclass(frozen=True)
class Principal:
    """A request's tenant, with what it may do and hold (auth.tenants[])."""

    settings: TenantConfig = field(default_factory=lambda: TenantConfig(name=DEFAULT_TENANT))

    @property
    def tenant(self) -> str:
        return self.settings.name

    @property
    def may_set_priority(self) -> bool:
        return self.settings.may_set_priority


current_principal: ContextVar[Principal | None] = ContextVar("llm_serving_principal", default=None)


def request_tenant() -> str | None:
    """The tenant a store read or write is confined to: the request's; None for the platform."""
    principal = current_principal.get()
    return None if principal is None else principal.tenant


def request_settings() -> TenantConfig | None:
    """The request's tenant's settings (its limits); None for the platform's own work."""
    principal = current_principal.get()
    return None if principal is None else principal.settings


def owner_tenant() -> str:
    """The tenant a new record belongs to: the request's, else the default tenant."""
    return request_tenant() or DEFAULT_TENANT


@contextlib.contextmanager
def acting_as(principal: Principal | None) -> Iterator[None]:
    """Run a block as `principal` (a batch line runs as its batch's tenant)."""
    token = current_principal.set(principal)
    try:
        yield
    finally:
        current_principal.reset(token)

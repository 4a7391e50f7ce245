"""`GET /v1/usage`: the usage ledger (serving/state/ledger.py) over HTTP, for admins only (a tenant
with `admin: true`, or anyone when no key is configured at all). Query: `tenant`, `since` (a day,
YYYY-MM-DD, inclusive). Served by every vLLM replica and by the model router, from the store."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import FastAPI, Query
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api.auth import route_path
from serving.api.errors import APIError, install_error_handlers
from serving.state.ledger import LedgerStore
from serving.state.tenancy import current_principal

PATH = "/v1/usage"
DAY = r"^\d{4}-\d{2}-\d{2}$"


def usage_app(store: LedgerStore, open_to_all: bool) -> FastAPI:
    """The route over `store`; `open_to_all`: no key is configured (every request may read)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app)

    @app.get(PATH)
    async def usage(
        tenant: Annotated[str | None, Query(max_length=64)] = None,
        since: Annotated[str | None, Query(pattern=DAY)] = None,
    ) -> dict[str, Any]:
        principal = current_principal.get()
        if not open_to_all and (principal is None or not principal.settings.admin):
            raise APIError(
                "the usage ledger is for admins: a key of a tenant with admin: true",
                status=403,
                code="admin_only",
            )
        rows = await asyncio.to_thread(store.usage, tenant, since)
        return {"object": "list", "data": rows}

    return app


class UsageRoute:
    """ASGI: `/v1/usage` goes to the ledger's app, the rest to `app`."""

    def __init__(self, usage: ASGIApp, app: ASGIApp) -> None:
        self.usage = usage
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope) == PATH:
            await self.usage(scope, receive, send)
            return
        await self.app(scope, receive, send)

"""Tenants' rate limits (issue 46): requests, tokens and requests in flight per tenant, counted in
one store shared by two middleware instances as two replicas share it; a request over a limit is a
429 in the OpenAI shape naming it, with Retry-After, and every answer to a limited tenant carries
OpenAI's x-ratelimit headers. The store is a real SQLite file (PostgreSQL runs the same code in
test_state_store.py's fixtures)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from serving.api.auth import APIKeyAuth, KeyRing
from serving.api.quotas import TenantQuotas, reset_in
from serving.config.access import TenantConfig
from serving.config.state import StateConfig
from serving.state.store import Store

TENANTS = [
    TenantConfig(name="team-a", requests_per_minute=3, tokens_per_minute=100),
    TenantConfig(name="team-b", max_concurrent_requests=2),
]
RING = KeyRing.of_tenants({"team-a": ["sk-a"], "team-b": ["sk-b"], "team-c": ["sk-c"]}, TENANTS)


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse({"ok": True})(scope, receive, send)


def replica(store: Store, name: str, app=ok, refused: list[str] | None = None) -> httpx.AsyncClient:
    seen = refused if refused is not None else []
    quotas = TenantQuotas(app, store, name, seen.append)
    transport = httpx.ASGITransport(app=APIKeyAuth(quotas, RING))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}"))


async def test_requests_per_minute_hold_across_two_replicas(store: Store) -> None:
    if reset_in(time.time()) < 5:  # the minute would turn over mid-test
        await asyncio.sleep(reset_in(time.time()) + 0.1)
    refused: list[str] = []
    one, two = replica(store, "r1", refused=refused), replica(store, "r2", refused=refused)
    answers = [
        await (one if n % 2 else two).get("/v1/models", headers=auth("sk-a")) for n in range(4)
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers[:3]] == ["2", "1", "0"]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
    assert answers[0].headers["x-ratelimit-limit-tokens"] == "100"
    over = answers[3]
    body = over.json()["error"]
    assert body["code"] == "requests_per_minute_exceeded" and body["type"] == "rate_limit_exceeded"
    assert "auth.tenants[].requests_per_minute=3" in body["message"]
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    assert over.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused == ["team-a"]
    other = await one.get("/v1/models", headers=auth("sk-c"))  # no limits: untouched, no headers
    assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers


async def test_tokens_per_minute_refuse_once_the_minute_is_used(store: Store) -> None:
    if reset_in(time.time()) < 5:
        await asyncio.sleep(reset_in(time.time()) + 0.1)
    client = replica(store, "r1")
    store.add_tokens("team-a", time.time(), 60)
    first = await client.get("/v1/models", headers=auth("sk-a"))
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-tokens"] == "40"
    store.add_tokens("team-a", time.time(), 40)
    refused = await client.get("/v1/models", headers=auth("sk-a"))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "tokens_per_minute_exceeded"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_concurrent_requests_hold_across_two_replicas(store: Store) -> None:
    release = asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await release.wait()
        await ok(scope, receive, send)

    one, two = replica(store, "r1", slow), replica(store, "r2", slow)
    held = [asyncio.create_task(c.get("/v1/models", headers=auth("sk-b"))) for c in (one, two)]
    for _ in range(100):  # bounded: both reported to the store (each replica writes its count)
        await asyncio.sleep(0.05)
        if store.inflight_elsewhere("team-b", "r3") == 2:
            break
    third = await two.get("/v1/models", headers=auth("sk-b"))
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "max_concurrent_requests_exceeded"
    assert third.headers["Retry-After"] == "1"
    release.set()
    assert [(await task).status_code for task in held] == [200, 200]
    for _ in range(100):
        await asyncio.sleep(0.05)
        if store.inflight_elsewhere("team-b", "r3") == 0:
            break
    assert (await one.get("/v1/models", headers=auth("sk-b"))).status_code == 200

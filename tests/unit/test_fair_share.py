"""Fair share of a saturated replica (issue 46): below capacity nothing waits; once full, each freed
place goes to the waiting tenant served least (tokens / weight), first come first served within a
tenant; an idle tenant starts level with the busy ones; a request cancelled while it waits gives
its turn up. Driven through admit/release and through the ASGI layer with real principals."""

from __future__ import annotations

import asyncio

import httpx

from serving.api.auth import APIKeyAuth, KeyRing
from serving.api.fair_share import FairShare, slack
from serving.state.tenancy import current_principal


async def ok(scope, receive, send) -> None:  # noqa: ANN001  (an ASGI app)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def full_share(weights: dict[str, float] | None = None) -> FairShare:
    fair = FairShare(ok, capacity=1, weights=weights or {})
    assert fair.capacity == 1 + slack(1) == 3
    return fair


async def waiting(fair: FairShare, tenant: str, order: list[str]) -> None:
    await fair.admit(tenant)
    order.append(tenant)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_below_capacity_nothing_waits() -> None:
    fair = full_share()
    for tenant in ("a", "a", "b"):
        await asyncio.wait_for(fair.admit(tenant), 1)
    assert fair.running == 3 and fair.queued() == 0


async def test_a_freed_place_goes_to_the_tenant_served_least() -> None:
    fair = full_share()
    for _ in range(3):
        await fair.admit("noisy")
    fair.charge("noisy", 800)  # long prompts
    order: list[str] = []
    tasks = [asyncio.create_task(waiting(fair, "noisy", order)) for _ in range(3)]
    await settle()
    tasks.append(asyncio.create_task(waiting(fair, "quiet", order)))  # arrives last
    await settle()
    assert fair.queued() == 4 and order == []
    fair.release("noisy")
    await settle()
    assert order == ["quiet"]  # before the three that came first
    fair.release("noisy")
    fair.release("noisy")
    await settle()
    assert order == ["quiet", "noisy", "noisy"]
    fair.release("quiet")
    await asyncio.gather(*tasks)
    assert order[-1] == "noisy" and fair.running == 3


async def test_weights_split_the_places() -> None:
    fair = full_share({"big": 3.0})
    for _ in range(3):
        await fair.admit("big")
    order: list[str] = []
    tasks = [asyncio.create_task(waiting(fair, t, order)) for t in ("big", "small") * 12]
    await settle()
    for _ in range(12):  # each admitted request served 300 tokens
        tenant = order[-1] if order else "big"
        fair.charge(tenant, 300)
        fair.release(tenant)
        await settle()
    for task in tasks:
        task.cancel()
    # big's 300 tokens count 100 at weight 3: about three places for each of small's
    assert order[4:].count("big") == 6 and order[4:].count("small") == 2, order  # once level


async def test_an_idle_tenant_starts_level_with_the_busy_ones() -> None:
    fair = full_share()
    fair.charge("early", 10_000)
    fair.charge("other", 9_000)
    for _ in range(3):
        await fair.admit("other")
    order: list[str] = []
    asyncio.create_task(waiting(fair, "other", order))
    await settle()
    late = asyncio.create_task(waiting(fair, "late", order))  # never served: 0 until it comes
    await settle()
    assert fair.served["late"] == 9_000  # not 0: it banked nothing while idle
    fair.charge("late", 1)  # now served more than "other": "other" goes first
    fair.release("other")
    await settle()
    assert order == ["other"]
    late.cancel()


async def test_a_request_cancelled_while_waiting_gives_its_turn_up() -> None:
    fair = full_share()
    for _ in range(3):
        await fair.admit("a")
    gone = asyncio.create_task(fair.admit("b"))
    order: list[str] = []
    stays = asyncio.create_task(waiting(fair, "c", order))
    await settle()
    gone.cancel()
    await settle()
    fair.release("a")
    await asyncio.wait_for(stays, 1)
    assert order == ["c"] and fair.queued() == 0 and fair.running == 3


async def test_requests_run_as_their_tenant_through_the_asgi_layer() -> None:
    release = asyncio.Event()
    served: list[str] = []

    async def engine(scope, receive, send) -> None:  # noqa: ANN001  (an ASGI app)
        principal = current_principal.get()
        assert principal is not None
        await release.wait()
        served.append(principal.tenant)
        await ok(scope, receive, send)

    fair = FairShare(engine, capacity=1, weights={})
    ring = KeyRing.of_tenants({"a": ["sk-a"], "b": ["sk-b"]})
    transport = httpx.ASGITransport(app=APIKeyAuth(fair, ring))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

        def post(key: str) -> asyncio.Task:
            headers = {"Authorization": f"Bearer {key}"}
            return asyncio.create_task(
                client.post("/v1/chat/completions", json={}, headers=headers)
            )

        tasks = [post("sk-a") for _ in range(5)]
        await settle()
        tasks.append(post("sk-b"))
        await settle()
        assert fair.running == 3 and fair.queued() == 3
        release.set()
        answers = await asyncio.gather(*tasks)
    assert [a.status_code for a in answers] == [200] * 6
    assert served.index("b") < 5  # b was not last, behind a's two waiting requests

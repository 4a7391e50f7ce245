"""Fair share of a replica (issue 46): one tenant alone gets the engine's slots and the slack; with
several busy, each holds at most its weighted share of the slots, a slot one of them may return to
is kept from the others, a free slot beyond the shares goes to the tenant served least (tokens /
weight), an idle tenant starts level with the busy ones, and a request cancelled while it waits
gives its turn up. Driven through admit/release and through the ASGI layer with real principals."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serving.api import fair_share
from serving.api.auth import APIKeyAuth, KeyRing
from serving.api.fair_share import FairShare, slack
from serving.state.tenancy import current_principal

SLOTS = 4  # the engine's max_num_seqs


async def ok(scope, receive, send) -> None:  # noqa: ANN001  (an ASGI app)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def waiting(fair: FairShare, tenant: str, order: list[str]) -> None:
    await fair.admit(tenant)
    order.append(tenant)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_tenant_alone_gets_the_slots_and_the_slack() -> None:
    fair = FairShare(ok, SLOTS, {})
    for _ in range(SLOTS + slack(SLOTS)):
        await asyncio.wait_for(fair.admit("a"), 1)
    order: list[str] = []
    asyncio.create_task(waiting(fair, "a", order))
    await settle()
    assert fair.running == 6 and fair.queued() == 1 and order == []
    fair.release("a")
    await settle()
    assert order == ["a"]


async def test_a_burst_cannot_take_the_slots_a_busy_tenant_returns_to() -> None:
    fair = FairShare(ok, SLOTS, {})
    await fair.admit("quiet")
    order: list[str] = []
    noisy = [asyncio.create_task(waiting(fair, "noisy", order)) for _ in range(6)]
    await settle()
    assert order == ["noisy", "noisy"]  # its share of 4 slots between two busy tenants
    assert fair.running == 3  # one slot is held for quiet, which may send again
    await asyncio.wait_for(fair.admit("quiet"), 1)  # finds it at once
    fair.release("quiet")  # quiet stays busy (its grace): its slot stays its own
    await settle()
    assert order == ["noisy", "noisy"]
    for task in noisy:
        task.cancel()


async def test_slots_beyond_the_shares_go_to_the_tenant_served_least() -> None:
    fair = FairShare(ok, SLOTS, {})
    for tenant in ("a", "b", "c", "a"):  # a share of one slot each (4 // 3); a took the fourth
        await fair.admit(tenant)
    fair.charge("a", 500)
    fair.charge("b", 100)
    fair.charge("c", 900)
    order: list[str] = []
    tasks = [asyncio.create_task(waiting(fair, t, order)) for t in ("c", "a", "b")]
    await settle()
    assert order == [] and fair.queued() == 3
    fair.release("a")  # the slot beyond the shares, held for nobody: the least served
    await settle()
    assert order == ["b"]
    fair.release("c")  # c's own slot, and c waits
    await settle()
    assert order == ["b", "c"]
    for task in tasks:
        task.cancel()


async def test_weights_split_the_slots() -> None:
    fair = FairShare(ok, SLOTS, {"big": 3.0})
    await fair.admit("small")
    order: list[str] = []
    tasks = [asyncio.create_task(waiting(fair, "big", order)) for _ in range(4)]
    await settle()
    assert order == ["big"] * 3  # floor(4 * 3 / 4)
    for task in tasks:
        task.cancel()


async def test_an_idle_tenant_starts_level_with_the_busy_ones() -> None:
    fair = FairShare(ok, SLOTS, {})
    fair.charge("late", 10)
    fair.charge("other", 9_000)
    await fair.admit("other")
    await fair.admit("late")
    assert fair.served["late"] == 9_000  # not 10: it banked nothing while idle


async def test_a_request_cancelled_while_waiting_gives_its_turn_up() -> None:
    fair = FairShare(ok, SLOTS, {})
    for _ in range(SLOTS + slack(SLOTS)):
        await fair.admit("a")
    gone = asyncio.create_task(fair.admit("a"))
    order: list[str] = []
    stays = asyncio.create_task(waiting(fair, "a", order))
    await settle()
    gone.cancel()
    await settle()
    fair.release("a")
    await asyncio.wait_for(stays, 1)
    assert order == ["a"] and fair.queued() == 0


async def test_slots_held_for_a_tenant_that_went_idle_go_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fair_share, "GRACE_S", 0.05)
    fair = FairShare(ok, SLOTS, {})
    await fair.admit("quiet")
    order: list[str] = []
    tasks = [asyncio.create_task(waiting(fair, "noisy", order)) for _ in range(5)]
    await settle()
    assert len(order) == 2
    fair.release("quiet")  # and quiet sends nothing more
    await asyncio.sleep(0.2)  # past its grace, the waiting noisy requests take the engine
    assert len(order) == 5
    for task in tasks:
        task.cancel()


async def test_requests_run_as_their_tenant_through_the_asgi_layer() -> None:
    release = asyncio.Event()
    served: list[str] = []

    async def engine(scope, receive, send) -> None:  # noqa: ANN001  (an ASGI app)
        principal = current_principal.get()
        assert principal is not None
        await release.wait()
        served.append(principal.tenant)
        await ok(scope, receive, send)

    fair = FairShare(engine, 2, {})
    ring = KeyRing.of_tenants({"a": ["sk-a"], "b": ["sk-b"]})
    transport = httpx.ASGITransport(app=APIKeyAuth(fair, ring))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

        def post(key: str) -> asyncio.Task:
            headers = {"Authorization": f"Bearer {key}"}
            return asyncio.create_task(
                client.post("/v1/chat/completions", json={}, headers=headers)
            )

        tasks = [post("sk-a") for _ in range(6)]
        await settle()
        assert fair.running == 2 + slack(2)  # a alone: slots and slack
        tasks.append(post("sk-b"))
        await settle()
        assert fair.queued() == 3
        release.set()
        answers = await asyncio.gather(*tasks)
    assert [a.status_code for a in answers] == [200] * 7
    assert served.index("b") < 6  # b was not last, behind a's waiting requests

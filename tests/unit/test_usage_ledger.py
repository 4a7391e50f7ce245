"""The usage ledger (issue 46): each engine request's tokens counted from the engine's outputs as
vLLM counts them for `usage` (streamed deltas or cumulative outputs), for the tenant of the request
that started it; the tally flushed to the store by day, tenant, model and adapter; read back by the
admin-only `GET /v1/usage` and `llm-serving usage`."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner

from serving.api.auth import APIKeyAuth, KeyRing
from serving.api.usage import Usage, UsageRecorder, counted
from serving.api.usage_routes import UsageRoute, usage_app
from serving.cli import main
from serving.config.access import TenantConfig
from serving.config.state import StateConfig
from serving.state.ledger import Tally, day_of
from serving.state.store import Store
from serving.state.tenancy import Principal, acting_as


def output(prompt: int, tokens: list[int], cached: int = 0) -> SimpleNamespace:
    choices = [SimpleNamespace(index=i, token_ids=[0] * n) for i, n in enumerate(tokens)]
    return SimpleNamespace(prompt_token_ids=[1] * prompt, num_cached_tokens=cached, outputs=choices)


async def stream(outputs: list[SimpleNamespace], fail: bool = False) -> AsyncIterator:
    for item in outputs:
        yield item
    if fail:
        raise RuntimeError("engine died")


async def drain(outputs: AsyncIterator) -> None:
    async for _ in outputs:
        pass


DELTA = SimpleNamespace(output_kind=SimpleNamespace(name="DELTA"))
CUMULATIVE = SimpleNamespace(output_kind=SimpleNamespace(name="CUMULATIVE"))


async def test_an_engine_requests_tokens_are_counted_for_its_tenant() -> None:
    seen: list[Usage] = []
    metered = TenantConfig(name="team-a", tokens_per_minute=1000)
    with acting_as(Principal(metered)):
        deltas = [output(7, [1, 1], cached=4), output(7, [2, 1]), output(7, [0, 3])]
        await drain(counted(stream(deltas), DELTA, "tiny", "lora-a", seen.append))
        cumulative = [output(5, [1]), output(5, [2]), output(5, [6])]
        await drain(counted(stream(cumulative), CUMULATIVE, "tiny", "", seen.append))
    with pytest.raises(RuntimeError):
        failing = stream([output(3, [2])], fail=True)
        await drain(counted(failing, CUMULATIVE, "tiny", "", seen.append))
    assert seen == [
        Usage("team-a", "tiny", "lora-a", 7, 4, 8, "ok", metered=True),  # 3 + 5 streamed
        Usage("team-a", "tiny", "", 5, 0, 6, "ok", metered=True),  # the last cumulative count
        Usage("default", "tiny", "", 3, 0, 2, "error", metered=False),
    ]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}"))


async def test_the_tally_reaches_the_store_by_day_tenant_model_and_adapter(store: Store) -> None:
    record = UsageRecorder(Tally(store), store)
    record(Usage("team-a", "tiny", "", 10, 4, 5, metered=True))
    record(Usage("team-a", "tiny", "", 20, 0, 7, metered=True))
    record(Usage("team-a", "tiny", "lora-a", 3, 0, 1, "error"))
    record(Usage("team-b", "tiny", "", outcome="refused"))
    record.tally.flush()
    record(Usage("team-a", "tiny", "", 1, 0, 1))  # a second flush adds to the stored row
    record.tally.flush()
    today = day_of(time.time())
    rows = {(r["tenant"], r["adapter"]): r for r in store.usage(since=today)}
    assert {k: rows[("team-a", "")][k] for k in ("requests", "prompt_tokens", "output_tokens")} == {
        "requests": 3,
        "prompt_tokens": 31,
        "output_tokens": 13,
    }
    assert rows[("team-a", "")]["cached_tokens"] == 4
    assert (rows[("team-a", "lora-a")]["errors"], rows[("team-a", "lora-a")]["requests"]) == (1, 1)
    assert (rows[("team-b", "")]["refusals"], rows[("team-b", "")]["requests"]) == (1, 0)
    assert store.usage(tenant="team-b", since=today) == [rows[("team-b", "")]]
    for _ in range(50):  # the metered tenant's minute window counts its tokens (in a thread)
        if store.window_counts("team-a", time.time())[1] == 42:
            break
        await asyncio.sleep(0.05)
    assert store.window_counts("team-a", time.time())[1] in (42, 0)  # 0: the minute turned over


async def test_the_usage_route_is_for_admins(store: Store) -> None:
    store.add_usage({(day_of(time.time()), "team-a", "tiny", ""): Counter(requests=2)})
    tenants = [TenantConfig(name="ops", admin=True)]
    ring = KeyRing.of_tenants({"ops": ["sk-ops"], "team-a": ["sk-a"]}, tenants)

    def client(app) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    guarded = client(APIKeyAuth(UsageRoute(usage_app(store, False), usage_app(store, False)), ring))
    admin = await guarded.get("/v1/usage", headers={"Authorization": "Bearer sk-ops"})
    assert admin.status_code == 200 and admin.json()["data"][0]["requests"] == 2
    refused = await guarded.get("/v1/usage", headers={"Authorization": "Bearer sk-a"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
    bad = await guarded.get("/v1/usage?since=yesterday", headers={"Authorization": "Bearer sk-ops"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.since"
    open_app = client(APIKeyAuth(usage_app(store, True), KeyRing()))
    assert (await open_app.get("/v1/usage")).json()["data"][0]["tenant"] == "team-a"


def test_the_usage_command_prints_the_ledger(store: Store, tmp_path: Path) -> None:
    store.add_usage({(day_of(time.time()), "team-a", "tiny", ""): Counter(output_tokens=9)})
    config = tmp_path / "platform.yaml"
    config.write_text(f"state: {{url: 'sqlite:///{tmp_path / 'state.db'}'}}\n")
    result = CliRunner().invoke(main, ["usage", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    assert [row["output_tokens"] for row in json.loads(result.output)] == [9]
    table = CliRunner().invoke(main, ["usage", "--config", str(config), "--since", "1d"])
    assert table.exit_code == 0 and "team-a" in table.output and "output_tokens" in table.output
    none = CliRunner().invoke(main, ["usage", "--config", str(config), "--tenant", "team-b"])
    assert "team-a" not in none.output
    bad = CliRunner().invoke(main, ["usage", "--config", str(config), "--since", "soon"])
    assert bad.exit_code == 2 and "7d" in bad.output

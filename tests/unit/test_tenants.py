"""Tenants (issue 46): each key's tenant, the principal a request runs as, the Batch API's files
and batches confined to their tenant (another tenant's are 404s), and `priority` only for tenants
that may set it. The store's own tenant filters are in test_state_store.py (both backends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from serving.api.auth import APIKeyAuth, KeyRing, configured_keys
from serving.api.batch_api import BatchRoutes, batch_app
from serving.api.vllm_wrap import priority_refusal
from serving.config import ConfigError, parse_config
from serving.config.access import DEFAULT_TENANT, AuthConfig, TenantConfig
from serving.config.state import BatchSettings, StateConfig
from serving.state.batches import Batches
from serving.state.store import Store
from serving.state.tenancy import Principal, acting_as, current_principal

TENANTS = {
    "tenants": [
        {"name": "team-a", "api_keys": ["sk-a"], "may_set_priority": True},
        {"name": "team-b", "api_keys_env": "TEAM_B_KEYS"},
    ]
}


def test_each_key_belongs_to_its_tenant_and_auth_keys_to_the_default() -> None:
    auth = AuthConfig(api_keys=["sk-d"], **TENANTS)
    ring = configured_keys(auth, {"TEAM_B_KEYS": "sk-b1, sk-b2", "LLM_SERVING_API_KEYS": "sk-e"})
    assert [ring.tenant_of(k) for k in ("sk-a", "sk-b1", "sk-b2", "sk-d", "sk-e", "sk-x")] == [
        "team-a",
        "team-b",
        "team-b",
        DEFAULT_TENANT,
        DEFAULT_TENANT,
        None,
    ]
    assert ring.principal("team-a").may_set_priority
    assert ring.principal("team-b").settings == auth.tenants[1]
    assert ring.principal(DEFAULT_TENANT).settings == TenantConfig(name=DEFAULT_TENANT)


def test_a_key_of_two_tenants_is_refused_in_the_config_and_from_the_environment() -> None:
    with pytest.raises(ConfigError, match="a key of team-a is also a key of default"):
        parse_config({"auth": {"api_keys": ["sk-a"], **TENANTS}})
    auth = AuthConfig(**TENANTS)
    with pytest.raises(ConfigError, match="a key of team-b is also a key of team-a") as err:
        configured_keys(auth, {"TEAM_B_KEYS": "sk-a"})
    assert "sk-a" not in str(err.value)  # a key is never shown


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ([{"name": "a"}, {"name": "a"}], "names must differ"),
        ([{"name": "Team_A"}], "String should match pattern"),
        ([{"name": DEFAULT_TENANT, "api_keys": ["k"]}], "give it none of its own"),
        ([{"name": "a", "api_keys_env": "LLM_SERVING_API_KEYS"}], "api_keys_env must differ"),
    ],
)
def test_bad_tenants_are_config_errors(tenants: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"auth": {"tenants": tenants}})


async def principal_app(scope: Scope, receive: Receive, send: Send) -> None:
    principal = current_principal.get()
    await JSONResponse({"principal": None if principal is None else principal.tenant})(
        scope, receive, send
    )


def test_a_request_runs_as_its_keys_tenant_and_as_the_default_without_keys() -> None:
    ring = configured_keys(AuthConfig(**TENANTS), {"TEAM_B_KEYS": "sk-b"})
    client = TestClient(APIKeyAuth(principal_app, ring))
    for key, tenant in (("sk-a", "team-a"), ("sk-b", "team-b")):
        answer = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert answer.json() == {"principal": tenant}
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-x"}).status_code == 401
    open_client = TestClient(APIKeyAuth(principal_app, KeyRing()))
    assert open_client.get("/v1/models").json() == {"principal": DEFAULT_TENANT}


def test_priority_is_refused_unless_the_tenant_may_set_it() -> None:
    none = Headers({})
    with acting_as(Principal(TenantConfig(name="team-b"))):
        refused = priority_refusal({"priority": -1000000}, none)
        assert refused is not None and refused.status == 403 and refused.param == "priority"
        assert priority_refusal({}, Headers({"x-vllm-priority": "-5"})) is not None
        assert priority_refusal({"priority": 0}, none) is None
        assert priority_refusal({"model": "m"}, none) is None
    with acting_as(Principal(TenantConfig(name="team-a", may_set_priority=True))):
        assert priority_refusal({"priority": -5}, none) is None
    assert priority_refusal({"priority": 5}, none) is None  # the platform's own (batch lines)


# -- the Batch API with two tenants -----------------------------------------------------------------


async def vllm_stub(scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse("vllm")(scope, receive, send)


LINE = (
    b'{"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", "body": '
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'
)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[dict[str, openai.OpenAI]]:
    store = Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}"))
    batches = Batches(store, BatchSettings())
    limited = TenantConfig(name="team-b", max_stored_bytes=1000, max_running_batches=1)
    ring = KeyRing.of_tenants({"team-a": ["sk-a"], "team-b": ["sk-b"]}, [limited])
    app = APIKeyAuth(BatchRoutes(batch_app(batches, lambda: ({"m"}, "m", set())), vllm_stub), ring)
    http = TestClient(app, base_url="http://testserver")  # no lifespan: vLLM's app is a stub
    yield {
        tenant: openai.OpenAI(
            base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0
        )
        for tenant, key in (("team-a", "sk-a"), ("team-b", "sk-b"))
    }


def test_another_tenants_files_and_batches_are_404s_and_not_listed(
    clients: dict[str, openai.OpenAI],
) -> None:
    a, b = clients["team-a"], clients["team-b"]
    file = a.files.create(file=("in.jsonl", LINE), purpose="batch")
    batch = a.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: b.files.retrieve(file.id),
        lambda: b.files.content(file.id),
        lambda: b.files.delete(file.id),
        lambda: b.batches.retrieve(batch.id),
        lambda: b.batches.cancel(batch.id),
        lambda: b.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(b.files.list()) == [] and list(b.batches.list()) == []
    # the owner's objects are as they were
    assert a.files.content(file.id).content == LINE
    assert [f.id for f in a.files.list()] == [file.id]
    assert a.batches.retrieve(batch.id).status == batch.status
    assert [x.id for x in a.batches.list()] == [batch.id]


def test_a_tenant_at_its_storage_limit_is_refused_and_evicts_nothing(
    clients: dict[str, openai.OpenAI],
) -> None:
    a, b = clients["team-a"], clients["team-b"]
    oldest = a.files.create(file=("a.jsonl", LINE), purpose="batch")
    kept = []
    with pytest.raises(openai.RateLimitError) as refused:
        for n in range(10):  # each file holds its content and its record (~330 bytes)
            kept.append(b.files.create(file=(f"b{n}.jsonl", LINE), purpose="batch"))
    assert 1 <= len(kept) < 10
    assert refused.value.body["code"] == "storage_quota_exceeded"
    assert "max_stored_bytes=1000" in refused.value.body["message"]
    assert a.files.content(oldest.id).content == LINE  # another tenant's oldest is still there
    assert [b.files.content(f.id).content for f in kept] == [LINE] * len(kept)
    b.files.delete(kept[0].id)  # room again
    assert b.files.create(file=("again.jsonl", LINE), purpose="batch").bytes == len(LINE)


def test_a_tenant_at_its_running_batch_limit_is_refused(clients: dict[str, openai.OpenAI]) -> None:
    b = clients["team-b"]
    file = b.files.create(file=("b.jsonl", LINE), purpose="batch")
    create = {"input_file_id": file.id, "endpoint": "/v1/chat/completions"}
    first = b.batches.create(**create, completion_window="24h")  # no runner here: it stays
    with pytest.raises(openai.RateLimitError) as refused:
        b.batches.create(**create, completion_window="24h")
    assert refused.value.body["code"] == "batch_quota_exceeded"
    b.batches.cancel(first.id)  # cancelling, then cancelled: no longer running
    clients["team-a"].batches.create(  # another tenant is not held by team-b's limit
        input_file_id=clients["team-a"].files.create(file=("a.jsonl", LINE), purpose="batch").id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )

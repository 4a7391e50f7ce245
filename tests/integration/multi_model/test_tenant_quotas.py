"""Tenants' limits and usage on the multi-model endpoint (issue 46), through the model router to
the two-replica model: a tenant over its requests per minute, its requests in flight or its stored
bytes gets a 429 in the OpenAI shape with Retry-After and the x-ratelimit headers, counted across
both replicas, while another tenant is unaffected; the usage ledger (admin route) equals the sums
of the `usage` the clients received, and the Prometheus counters carry the tenant label."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from serving.api.quotas import reset_in
from serving.metrics import TENANT_OUTPUT_TOKENS, counter_values
from serving.state.ledger import day_of
from tests.integration.multi_model.conftest import METRICS_PORT, TENANT_KEYS

MODEL = "tiny"  # two replicas, session routing
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def headers(tenant: str, session: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANT_KEYS[tenant]}", "x-session-id": session}


def test_requests_per_minute_hold_across_both_replicas(endpoint: str) -> None:
    if reset_in(time.time()) < 20:  # the 8 requests must fall in one minute's window
        time.sleep(reset_in(time.time()) + 0.5)
    answers, replicas = [], set()
    with httpx.Client(timeout=120) as http:
        for n in range(8):
            answer = http.post(
                f"{endpoint}/chat/completions", json=CHAT, headers=headers("team-q", f"q-{n}")
            )
            answers.append(answer)
            replicas.add(answer.headers.get("x-llm-serving-replica"))
        other = http.post(f"{endpoint}/chat/completions", json=CHAT, headers=headers("team-b", "b"))
    assert [a.status_code for a in answers] == [200] * 6 + [429] * 2
    assert len(replicas - {None}) == 2, replicas  # both replicas counted into one limit
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == [
        *map(str, range(5, -1, -1)),
        "0",
        "0",
    ]
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "requests_per_minute_exceeded"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["x-ratelimit-limit-requests"] == "6"
    assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers


async def test_requests_in_flight_hold_across_both_replicas(endpoint: str) -> None:
    long = {**CHAT, "max_tokens": 120, "stream": True, "ignore_eos": True}

    async def stream(http: httpx.AsyncClient, session: str, started: asyncio.Event) -> int:
        async with http.stream(
            "POST", f"{endpoint}/chat/completions", json=long, headers=headers("team-k", session)
        ) as answer:
            started.set()
            async for _ in answer.aiter_bytes():
                pass
            return answer.status_code

    async with httpx.AsyncClient(timeout=300) as http:
        events = [asyncio.Event(), asyncio.Event()]
        running = [asyncio.create_task(stream(http, f"c-{n}", events[n])) for n in range(2)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
        await asyncio.sleep(1.0)  # each replica has written its count to the store
        third = await http.post(
            f"{endpoint}/chat/completions", json=CHAT, headers=headers("team-k", "c-2")
        )
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "max_concurrent_requests_exceeded"
        assert [await task for task in running] == [200, 200]


def test_a_tenant_at_its_stored_bytes_is_refused_and_another_keeps_its_oldest(
    endpoint: str,
) -> None:
    q = openai.OpenAI(base_url=endpoint, api_key=TENANT_KEYS["team-q"], max_retries=0)
    b = openai.OpenAI(base_url=endpoint, api_key=TENANT_KEYS["team-b"], max_retries=0)
    oldest = b.files.create(file=("b-oldest.jsonl", b"{}\n" * 100), purpose="batch")
    with pytest.raises(openai.RateLimitError) as refused:
        for n in range(10):  # bounded; 3000 bytes hold a few files of ~800
            q.files.create(file=(f"q{n}.jsonl", b"{}\n" * 200), purpose="batch")
    assert refused.value.body["code"] == "storage_quota_exceeded"
    assert b.files.content(oldest.id).content == b"{}\n" * 100
    for file in q.files.list():
        q.files.delete(file.id)


def ledger_sums(endpoint: str) -> tuple[int, int, int]:
    """team-c's prompt tokens, output tokens and requests in the ledger (admin route), today's."""
    admin = {"Authorization": f"Bearer {TENANT_KEYS['ops']}"}
    query = {"tenant": "team-c", "since": day_of(time.time() - 60)}
    rows = httpx.get(f"{endpoint}/usage", params=query, headers=admin, timeout=30).json()["data"]
    assert {r["model"] for r in rows} <= {MODEL}
    prompt, output, requests = (
        sum(r[k] for r in rows) for k in ("prompt_tokens", "output_tokens", "requests")
    )
    return prompt, output, requests


def test_the_ledger_equals_the_usage_the_clients_received(endpoint: str) -> None:
    c = openai.OpenAI(base_url=endpoint, api_key=TENANT_KEYS["team-c"], max_retries=0)
    before = ledger_sums(endpoint)  # the store outlives a platform: the ledger may hold more
    prompt = completion = 0
    for n in range(6):
        options = {"extra_headers": {"x-session-id": f"ledger-{n}"}}
        if n % 2:
            chunks = list(
                c.chat.completions.create(
                    **CHAT, stream=True, stream_options={"include_usage": True}, **options
                )
            )
            usage = chunks[-1].usage
        else:
            usage = c.completions.create(
                model=MODEL, prompt=f"Count {n}", max_tokens=3, **options
            ).usage
        prompt += usage.prompt_tokens
        completion += usage.completion_tokens
    sums = before
    for _ in range(60):  # bounded: each replica writes its tally every 2 s
        sums = ledger_sums(endpoint)
        if sums[:2] == (before[0] + prompt, before[1] + completion):
            break
        time.sleep(0.5)
    assert sums == (before[0] + prompt, before[1] + completion, before[2] + 6)
    refused = httpx.get(f"{endpoint}/usage", headers=headers("team-c", "x"), timeout=30)
    assert refused.status_code == 403
    exported = 0.0
    # The counter is this platform's own (from 0); bounded: Ray's agent exports every few seconds.
    for _ in range(60):
        text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        by_tenant = counter_values(text, TENANT_OUTPUT_TOKENS, ("tenant",))
        exported = by_tenant.get(("team-c",), 0.0)
        if exported == completion:
            break
        time.sleep(0.5)
    assert exported == completion

"""The Responses API's stored responses with two vLLM replicas of one model (issue 36): a
conversation chained with `previous_response_id`, retrieval, deletion and background mode (polled,
cancelled) work whichever replica answers. Each replica is called on its own HTTP server (the one
Serve's HAProxy forwards to), so every request is known to land on the replica the test names:
each follow-up and retrieval goes to the other replica than the one that created its response.

`stored_chain` and `check_chain` are for a restart test: a chain stored before `llm-serving down`
/ `up` reads back and continues after."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import psutil
import pytest

from tests.integration.conftest import MODEL, Platform, extra_app
from tests.integration.streams import wait_until
from tests.integration.test_faults import replica_pids, scaled_app, tiny_vllm_config

APP, PREFIX = "stored-responses", "/stored"
SHORT = {"model": MODEL, "max_output_tokens": 4, "temperature": 0.0}
LONG = {"model": MODEL, "max_output_tokens": 900, "extra_body": {"ignore_eos": True}}
CHAIN_TURNS = 10
DONE = ("completed", "incomplete")  # incomplete: it reached max_output_tokens


def stored_chain(client: openai.OpenAI, turns: int = 3) -> list[str]:
    """A stored conversation of `turns` responses, each continuing the one before: their ids."""
    ids = [client.responses.create(input="Hello there", store=True, **SHORT).id]
    for turn in range(turns - 1):
        follow = client.responses.create(
            input=f"And then {turn}?", previous_response_id=ids[-1], store=True, **SHORT
        )
        ids.append(follow.id)
    return ids


def check_chain(client: openai.OpenAI, ids: list[str]) -> None:
    """Every response of the chain reads back completed, each naming the one before, and the
    conversation continues from its last one (its history longer than the last prompt)."""
    chain = [client.responses.retrieve(response_id) for response_id in ids]
    assert [r.id for r in chain] == ids
    assert all(r.status in DONE for r in chain), chain
    assert [r.previous_response_id for r in chain] == [None, *ids[:-1]]
    follow = client.responses.create(input="Go on.", previous_response_id=ids[-1], **SHORT)
    assert follow.usage.input_tokens > chain[-1].usage.input_tokens + chain[-1].usage.output_tokens


# -- two replicas, each called on its own ----------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    url: str  # its own HTTP server, under the app's route prefix

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()


def answers_health(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def loopback(ip: str) -> str:
    ip = ip.removeprefix("::ffff:")
    return "127.0.0.1" if ip in ("0.0.0.0", "::") else ip


def replica_url(pid: int, prefix: str) -> str | None:
    """The HTTP server of the replica process `pid` (the one Serve's HAProxy forwards to): the
    port among its listening ones where the app's /health answers."""
    listening = {
        (loopback(c.laddr.ip), c.laddr.port)
        for c in psutil.Process(pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    urls = [
        f"http://{ip}:{port}{path}"
        for ip, port in sorted(listening)
        if ":" not in ip  # an IPv6 address other than a wildcard
        for path in (prefix, "")
    ]
    return next((url for url in urls if answers_health(url)), None)


@pytest.fixture(scope="module")
def replicas(platform: Platform) -> Iterator[tuple[Replica, Replica]]:
    with extra_app(APP, PREFIX, scaled_app(tiny_vllm_config(PREFIX), 2)):
        urls = [replica_url(pid, PREFIX) for pid in replica_pids(APP).values()]
        print(f"\nreplicas of {APP}: {urls}")
        assert len(urls) == 2 and None not in urls
        one, other = (Replica(url) for url in urls if url)
        yield one, other


def test_follow_ups_and_retrievals_succeed_on_the_other_replica(
    replicas: tuple[Replica, Replica], platform: Platform
) -> None:
    clients = [replica.client() for replica in replicas]
    chain = [clients[0].responses.create(input="Hello there", **SHORT)]
    for turn in range(CHAIN_TURNS):  # each follow-up on the replica that did not answer before
        follow = clients[(turn + 1) % 2].responses.create(
            input=f"And then {turn}?", previous_response_id=chain[-1].id, **SHORT
        )
        chain.append(follow)
    followed = sum(
        r.status in DONE
        and r.previous_response_id == before.id
        # its prompt holds the stored conversation: the previous prompt and its answer
        and r.usage.input_tokens > before.usage.input_tokens + before.usage.output_tokens
        for before, r in zip(chain, chain[1:])
    )
    retrieved = sum(  # each response read on the replica that did not create it
        clients[(n + 1) % 2].responses.retrieve(r.id).output_text == r.output_text
        for n, r in enumerate(chain[1:], start=1)
    )
    through_haproxy = platform.client(PREFIX).responses.retrieve(chain[-1].id)
    print(f"\nstored responses over two replicas: {followed}/10 follow-ups, {retrieved}/10 reads")
    assert (followed, retrieved) == (CHAIN_TURNS, CHAIN_TURNS)
    assert through_haproxy.output_text == chain[-1].output_text
    check_chain(platform.client(PREFIX), [r.id for r in chain])


def test_a_response_deleted_on_one_replica_is_gone_on_the_other(
    replicas: tuple[Replica, Replica],
) -> None:
    one, other = (replica.client() for replica in replicas)
    response = one.responses.create(input="Forget me", **SHORT)
    deleted = other.responses.with_raw_response.delete(response.id)
    assert deleted.http_response.json() == {
        "id": response.id,
        "object": "response",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.create(input="Go on.", previous_response_id=response.id, **SHORT)
    with pytest.raises(openai.NotFoundError) as again:
        other.responses.delete(response.id)
    assert set(again.value.body) >= {"message", "type", "param", "code"}  # the OpenAI shape


def test_a_background_response_is_polled_to_completion_on_the_other_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    one, other = (replica.client() for replica in replicas)
    started = one.responses.create(input="Hello there", background=True, **SHORT)
    assert started.status == "queued"

    def done() -> bool:
        return other.responses.retrieve(started.id).status not in ("queued", "in_progress")

    assert wait_until(done, timeout_s=60, poll_s=0.2) is not None
    finished = other.responses.retrieve(started.id)
    assert finished.status in DONE and 0 < finished.usage.output_tokens <= 4
    streamed = httpx.get(f"{replicas[1].url}/v1/responses/{started.id}?stream=true", timeout=30)
    assert streamed.status_code == 400  # vLLM's events stay on the replica that ran it
    assert streamed.json()["error"]["param"] == "stream"


def test_a_background_response_cancelled_on_the_other_replica_aborts_its_engine_request(
    replicas: tuple[Replica, Replica],
) -> None:
    runner, canceller = replicas
    aborted_before = runner.health()["aborted_total"]
    started = runner.client().responses.create(input="Tell a story", background=True, **LONG)
    assert wait_until(lambda: runner.health()["running"] == 1, timeout_s=30, poll_s=0.05)
    cancelled = canceller.client().responses.cancel(started.id)
    assert cancelled.status == "cancelled"

    def aborted() -> bool:
        health = runner.health()
        return health["running"] == 0 and health["aborted_total"] == aborted_before + 1

    assert wait_until(aborted, timeout_s=30, poll_s=0.1) is not None, runner.health()
    assert runner.client().responses.retrieve(started.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # vLLM's answer for a response no longer running
        canceller.client().responses.cancel(started.id)

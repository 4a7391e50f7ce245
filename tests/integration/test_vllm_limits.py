"""The request limits on the real vLLM route (real Serve, real vLLM engine, the `openai` client):
a request over `limits.max_tokens` (beam search included), `limits.max_n` or
`limits.max_prompts_per_request` is a 400 naming the setting, and a request that ends early (the
deadline, a non-streaming client that leaves) frees the engine within 2 s."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from serving.config import parse_config
from serving.deployments.vllm_server import build_vllm_app
from tests.integration.conftest import MODEL, Platform, extra_app
from tests.integration.streams import wait_until

PREFIX = "/limited"
ABORT_BOUND_S = 2.0  # the bound: running back to 0 and aborted_total up within 2 s
# Room for the ordinary requests of these tests on a busy machine (the engine runs at niceness 19).
DEADLINE_S = 20.0
# 64 prompts x 16 choices x 64 tokens: 1024 sequences, 16 at a time: minutes, past the deadline.
HEAVY = {
    "model": MODEL,
    "prompt": [f"Tell story number {i}" for i in range(64)],
    "n": 16,
    "max_tokens": 64,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def limited(platform: Platform) -> Iterator[str]:
    """A vLLM app with `limits.max_tokens: 64` and a 20 s deadline beside the session's: its URL."""
    config = parse_config(
        {
            "model": {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"},
            "vllm": {
                "route_prefix": PREFIX,
                "engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 16},
            },
            "limits": {"max_tokens": 64, "request_timeout_s": DEADLINE_S},
        }
    )
    with extra_app("limited", PREFIX, build_vllm_app(config)):
        yield f"{platform.url}{PREFIX}"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=10).json()


def test_max_tokens_over_the_limit_is_a_400_naming_it_on_every_route(limited: str) -> None:
    api = client(limited)
    chat = [{"role": "user", "content": "Hello"}]
    calls = {
        "completions": lambda n: api.completions.create(model=MODEL, prompt="Hi", max_tokens=n),
        "chat": lambda n: api.chat.completions.create(model=MODEL, messages=chat, max_tokens=n),
        "chat max_completion_tokens": lambda n: api.chat.completions.create(
            model=MODEL, messages=chat, max_completion_tokens=n
        ),
        "responses": lambda n: api.responses.create(
            model=MODEL, input="Hello", max_output_tokens=n
        ),
    }
    for name, call in calls.items():
        with pytest.raises(openai.BadRequestError, match=r"limits\.max_tokens=64") as refused:
            call(400)
        assert refused.value.code == "max_tokens_too_large", name
    within = api.completions.create(
        model=MODEL, prompt="Hi", max_tokens=64, extra_body={"ignore_eos": True}
    )
    assert within.usage.completion_tokens == 64


def test_beam_search_is_held_to_max_tokens(limited: str) -> None:
    api = client(limited)
    beam = {"use_beam_search": True, "ignore_eos": True}
    with pytest.raises(openai.BadRequestError, match=r"limits\.max_tokens=64"):
        api.completions.create(model=MODEL, prompt="Hi", max_tokens=400, n=2, extra_body=beam)
    answer = api.completions.create(model=MODEL, prompt="Hi", max_tokens=8, n=2, extra_body=beam)
    assert len(answer.choices) == 2
    assert answer.usage.completion_tokens <= 2 * 8


def test_n_over_max_n_is_a_400_naming_it(limited: str) -> None:
    api = client(limited)
    for n in (17, 1000):
        with pytest.raises(openai.BadRequestError, match=r"limits\.max_n=16") as refused:
            api.completions.create(model=MODEL, prompt="Hi", max_tokens=1, n=n)
        assert refused.value.param == "n"
    with pytest.raises(openai.BadRequestError, match=r"limits\.max_n=16"):
        api.completions.create(
            model=MODEL, prompt="Hi", max_tokens=1, n=17, extra_body={"use_beam_search": True}
        )
    assert len(api.completions.create(model=MODEL, prompt="Hi", max_tokens=1, n=16).choices) == 16


def test_prompts_over_the_limit_are_a_400_naming_it(limited: str) -> None:
    api = client(limited)
    with pytest.raises(openai.BadRequestError, match=r"limits\.max_prompts_per_request=64"):
        api.completions.create(model=MODEL, prompt=["Hi"] * 65, max_tokens=1)


def wait_for_idle_engine(url: str, aborted_before: int) -> tuple[float | None, dict]:
    def idle() -> bool:
        now = health(url)
        return now["running"] == 0 and now["waiting"] == 0 and now["aborted_total"] > aborted_before

    freed_s = wait_until(idle, timeout_s=30, poll_s=0.05)
    return freed_s, health(url)


def test_the_deadline_aborts_a_non_streaming_request_in_the_engine(limited: str) -> None:
    before = health(limited)["aborted_total"]
    response = httpx.post(f"{limited}/v1/completions", json=HEAVY, timeout=60)
    assert response.status_code == 408, response.text
    assert f"limits.request_timeout_s={DEADLINE_S:g}" in response.json()["error"]["message"]
    freed_s, now = wait_for_idle_engine(limited, before)
    print(f"\ndeadline: engine idle {freed_s}s after the 408; {now}")
    assert freed_s is not None and freed_s <= ABORT_BOUND_S, now


def send_raw(url: str, path: str, body: dict) -> socket.socket:
    """A POST sent on a socket of its own, left unread: the test closes it when it chooses (an
    HTTP client's timeout only closes it when the client is done with it)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    payload = json.dumps(body).encode()
    head = (
        f"POST {parts.path}{path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_a_non_streaming_client_that_leaves_frees_the_engine(limited: str) -> None:
    before = health(limited)["aborted_total"]
    sent = time.monotonic()
    sock = send_raw(limited, "/v1/completions", HEAVY)
    busy = wait_until(lambda: health(limited)["running"] > 0, timeout_s=10, poll_s=0.05)
    # Reset, not a polite close: the client is gone, whatever the proxy makes of a half-close.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    left = {"at": time.monotonic()}
    assert busy is not None, "the engine never ran the request"
    freed_s, now = wait_for_idle_engine(limited, before)
    print(f"\ndisconnect: engine idle {freed_s}s after the client left; {now}")
    assert freed_s is not None and freed_s <= ABORT_BOUND_S, now
    # Freed by the disconnect, not by the deadline that would have come later.
    assert left["at"] + freed_s < sent + DEADLINE_S

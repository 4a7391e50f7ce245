"""Scale to zero: a vLLM deployment at zero replicas takes the next requests and holds them while
its first replica starts, under the HAProxy ingress (a single-model app: HAProxy sends them to
Serve's proxy, whose handle holds them) and behind the model router (one model at zero, the other
serving: the router's handle holds them). 4 concurrent requests, two of them streaming, are all
answered with 200; a fifth, over the held queue (backpressure.max_queued_requests 4), is a 503 in
the OpenAI shape with Retry-After. The cold start is reported, not asserted."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from serving.config import PlatformConfig, load_config, parse_config
from serving.deployments.model_router import build_router_app
from serving.deployments.vllm_server import build_vllm_app
from tests.integration.conftest import MODEL, Platform, extra_apps, run_cli

SINGLE, SINGLE_PREFIX = "cold-single", "/cold-single"
ROUTER, ROUTER_PREFIX = "cold-router", "/cold-router"
COLD, WARM = "cold", "warm"
HELD = 4  # backpressure.max_queued_requests of the models at zero
RETRY_AFTER_S = 2
ENGINE = {"kv_cache_memory_gb": 0.25, "max_num_seqs": 8, "engine_core": "inprocess"}
# Starts at zero (initial_replicas 0): no replica to wait for going down.
AT_ZERO = {"min_replicas": 0, "initial_replicas": 0, "max_replicas": 1, "upscale_delay_s": 0}
BACKPRESSURE = {
    "max_queued_requests": HELD,
    "retry_after_s": RETRY_AFTER_S,
    "max_queue_wait_s": 240,
}
PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


def single_model_app(platform: Platform) -> Any:
    """The platform's vLLM app, at zero, at SINGLE_PREFIX."""
    data = load_config(platform.config_path).model_dump(mode="json", exclude_unset=True)
    vllm = {
        "route_prefix": SINGLE_PREFIX,
        "engine": ENGINE,
        "autoscaling": AT_ZERO,
        "backpressure": BACKPRESSURE,
    }
    return build_vllm_app(parse_config({**data, "vllm": vllm}))


def router_apps(platform: Platform) -> list[tuple[str, str | None, Any]]:
    """Two models behind a router at ROUTER_PREFIX: COLD at zero, WARM with one replica."""
    model = {"ref": MODEL, "max_model_len": 1024, "dtype": "float32"}
    warm = {"name": WARM, "model": model, "engine": ENGINE}
    cold = {**warm, "name": COLD, "autoscaling": AT_ZERO, "backpressure": BACKPRESSURE}
    config: PlatformConfig = parse_config(
        {"vllm": {"route_prefix": ROUTER_PREFIX}, "models": [cold, warm]}
    )
    models = [
        (entry.app_name, None, build_vllm_app(config.model_platform(entry), behind_router=True))
        for entry in config.models
    ]
    return [*models, (ROUTER, ROUTER_PREFIX, build_router_app(config))]


def running_replicas(app: str) -> int:
    from ray import serve

    deployment = serve.status().applications[app].deployments["VLLMServer"]
    return sum(
        n
        for state, n in deployment.replica_states.items()
        if getattr(state, "value", state) == "RUNNING"
    )


async def chat(client: openai.AsyncOpenAI, model: str, stream: bool) -> tuple[str, float]:
    """The answer's text and the seconds to its first token."""
    sent = time.monotonic()
    if not stream:
        done = await client.chat.completions.create(model=model, messages=PROMPT, max_tokens=4)
        return done.choices[0].message.content or "", time.monotonic() - sent
    text, first = "", None
    chunks = await client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=4, stream=True
    )
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic() - sent
            text += chunk.choices[0].delta.content
    return text, first or time.monotonic() - sent


async def held_then_over(base_url: str, model: str, app: str) -> tuple[list, httpx.Response]:
    """HELD concurrent chats (two streaming) sent at zero, then one more while they are held."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    held = [asyncio.create_task(chat(client, model, stream=n < 2)) for n in range(HELD)]
    await asyncio.sleep(3)  # into Serve's queue; a replica takes 15 s or more to start here
    assert await asyncio.to_thread(running_replicas, app) == 0, "a replica started too soon"
    body = {"model": model, "messages": PROMPT, "max_tokens": 4}
    async with httpx.AsyncClient(timeout=60) as http:
        over = await http.post(f"{base_url}/chat/completions", json=body)
    answers = await asyncio.gather(*held, return_exceptions=True)
    return answers, over


def check(answers: list, over: httpx.Response) -> None:
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert not refused, refused
    assert all(text for text, _ in answers), answers
    print(f"\nfirst token after (s): {[round(s, 1) for _, s in answers]}")
    print(f"over the bound: {over.status_code} {dict(over.headers)} {over.text}")
    assert over.status_code == 503, over.text
    assert over.headers["retry-after"] == str(RETRY_AFTER_S)
    error = over.json()["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "queue_full", error
    assert f"max_queued_requests={HELD}" in error["message"] or "capacity" in error["message"]


def test_a_single_model_app_at_zero_holds_requests_under_haproxy(platform: Platform) -> None:
    with extra_apps([(SINGLE, SINGLE_PREFIX, single_model_app(platform))]):
        assert running_replicas(SINGLE) == 0
        answers, over = asyncio.run(
            held_then_over(f"{platform.url}{SINGLE_PREFIX}/v1", MODEL, SINGLE)
        )
        check(answers, over)


@pytest.fixture(scope="module")
def router(platform: Platform) -> Any:
    with extra_apps(router_apps(platform)):
        yield f"{platform.url}{ROUTER_PREFIX}/v1"


def test_a_model_at_zero_is_listed_as_cold_without_starting_it(router: str) -> None:
    cards = {card["id"]: card for card in httpx.get(f"{router}/models", timeout=30).json()["data"]}
    assert (cards[COLD]["cold"], cards[WARM]["cold"]) == (True, False), cards
    assert openai.OpenAI(base_url=router, api_key="unused", max_retries=0).models.list()
    status = run_cli("status", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    cold = json.loads(status.stdout)["cold"]
    assert f"vllm-{COLD}" in cold and f"vllm-{WARM}" not in cold, cold
    assert running_replicas(f"vllm-{COLD}") == 0


def test_behind_the_model_router_a_model_at_zero_holds_requests(router: str) -> None:
    warm = openai.OpenAI(base_url=router, api_key="unused", max_retries=0)
    assert warm.chat.completions.create(model=WARM, messages=PROMPT, max_tokens=4).choices
    answers, over = asyncio.run(held_then_over(router, COLD, f"vllm-{COLD}"))
    check(answers, over)
    cards = {card["id"]: card for card in httpx.get(f"{router}/models", timeout=30).json()["data"]}
    assert cards[COLD]["cold"] is False

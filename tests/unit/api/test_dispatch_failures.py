"""The router when its model's replica dies: before the first byte the request goes once more
(Serve picks a live replica), else a 503 in OpenAI's shape; after it, a stream ends with an
OpenAI error event and `[DONE]`, any other body just ends; never a bare cut or a plain-text 500.
Fake handles that raise stand in for Serve's; the real death: tests/integration/multi_model/test_multi_model.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from serving.api.dispatch import ModelDispatch
from serving.api.errors import APIError
from serving.api.model_routes import Route, model_routes
from serving.deployments.model_router import replica_lost
from serving.routing import RoutingHint

SSE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
}
JSON_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json")],
}


class Lost(Exception):
    """The replica's actor died (Serve raises RayActorError)."""


def body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


def dispatch(attempts: list[list[Any]], calls: list[Route] | None = None) -> ModelDispatch:
    """Each call of the model's handle plays the next script: messages to yield, and an exception
    to raise where it stands."""
    scripts = iter(attempts)

    def forward(route: Route):
        async def send(scope: dict[str, Any], body: bytes, hint: RoutingHint):
            if calls is not None:
                calls.append(route)
            for step in next(scripts):
                if isinstance(step, Exception):
                    raise step
                yield [step]

        return send

    def refusal(route: Route, err: Exception) -> APIError | None:
        if isinstance(err, Lost):
            return APIError("replica lost", status=503, headers={"Retry-After": "2"})
        return None

    routes = model_routes({"base": [], "other": []})
    return ModelDispatch(
        routes, "base", forward, refusal, replica_lost=lambda err: isinstance(err, Lost)
    )


def post(app: ModelDispatch, stream: bool = True) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post(
                "/v1/completions", json={"model": "base", "prompt": "x", "stream": stream}
            )

    return asyncio.run(go())


def test_a_replica_lost_before_the_first_byte_is_retried_once_on_another() -> None:
    calls: list[Route] = []
    app = dispatch([[Lost()], [SSE_START, body(b"data: ok\n\n", more=False)]], calls)
    response = post(app)
    assert response.status_code == 200 and response.text == "data: ok\n\n"
    assert calls == [Route("base"), Route("base")]


def test_two_lost_replicas_before_the_first_byte_are_a_503_in_openais_shape() -> None:
    calls: list[Route] = []
    response = post(dispatch([[Lost()], [Lost()]], calls))
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["message"] == "replica lost"
    assert len(calls) == 2  # once more, not forever


def test_another_failure_before_the_first_byte_is_not_retried_and_is_openai_shaped() -> None:
    calls: list[Route] = []
    response = post(dispatch([[RuntimeError("engine bug\nTraceback ...")]], calls))
    assert response.status_code == 503 and len(calls) == 1
    error = response.json()["error"]
    assert error["code"] == "replica_failed" and "RuntimeError" in error["message"]
    assert "Traceback" not in error["message"]  # the replica's details stay in its log


def test_a_replica_lost_mid_stream_ends_it_with_an_error_event_and_done() -> None:
    calls: list[Route] = []
    chunk = b'data: {"choices": []}\n\n'
    response = post(dispatch([[SSE_START, body(chunk), Lost()]], calls))
    assert response.status_code == 200 and len(calls) == 1  # never replayed after a byte
    first, error, done = [event for event in response.text.split("\n\n") if event]
    assert first + "\n\n" == chunk.decode() and done == "data: [DONE]"
    assert json.loads(error.removeprefix("data: "))["error"]["message"] == "replica lost"


def test_a_plain_body_cut_by_a_lost_replica_just_ends() -> None:
    response = post(dispatch([[JSON_START, body(b'{"partial": '), Lost()]]), stream=False)
    assert response.status_code == 200 and response.content == b'{"partial": '


def test_health_and_models_answer_when_a_models_replica_is_lost() -> None:
    cards = json.dumps({"data": [{"id": "other", "parent": None, "root": "/srv/models/x"}]})
    healthy = [JSON_START, body(cards.encode(), more=False)]

    async def go() -> tuple[httpx.Response, httpx.Response]:
        # the models are asked in name order: base (lost), then other
        app = dispatch([[Lost()], healthy, [Lost()], healthy])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.get("/health"), await http.get("/v1/models")

    health, models = asyncio.run(go())
    assert health.status_code == 503
    assert health.json()["models"]["base"]["error"]["code"] == "replica_failed"
    assert models.status_code == 503 and models.json()["error"]["code"] == "replica_failed"


@pytest.mark.parametrize(
    ("err", "lost"),
    [
        (ActorDiedError(), True),
        (ActorUnavailableError("Actor is unavailable.", b"\x00" * 16), True),
        (RuntimeError("x"), False),
    ],
)
def test_the_router_counts_a_dead_or_unreachable_actor_as_lost(err: Exception, lost: bool) -> None:
    assert replica_lost(err) is lost

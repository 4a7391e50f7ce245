"""The one endpoint's dispatch, without Ray: ModelDispatch over in-process `forward`s that run a
small ASGI app through `run_asgi`, as a model's replica does. The real path (Serve handles, vLLM's
app, adapters): tests/integration/multi_model/test_multi_model.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from serving.api.dispatch import ModelDispatch, parsed_body, run_asgi
from serving.api.errors import APIError
from serving.api.model_routes import Route, model_routes
from serving.api.runtime_adapters import adapter_card
from serving.routing import RoutingHint


def model_app(name: str, adapters: list[str]) -> FastAPI:
    """A stand-in for one model's vLLM app: echoes the route it got, lists its model cards."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def complete(request: Request) -> Any:
        body = await request.json()
        if body.get("stream"):

            async def chunks():
                for i in range(3):
                    yield f"data: {name}-{i}\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return {"served_by": name, "model": body.get("model"), "path": request.url.path}

    @app.get("/v1/models")
    async def models() -> Any:
        cards = [{"id": name, "parent": None, "root": f"/srv/models/{name}"}] + [
            {"id": a, "parent": name, "root": f"/srv/adapters/{a}"} for a in adapters
        ]
        return {"object": "list", "data": cards}

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "model": name}

    return app


class Refused(Exception):
    pass


def dispatch(
    forwarded: list[Route] | None = None,
    refuse: bool = False,
    hints: list[RoutingHint] | None = None,
) -> ModelDispatch:
    adapters = {"base": ["base-lora"], "other": []}
    apps = {name: model_app(name, names) for name, names in adapters.items()}

    def forward(route: Route):
        if forwarded is not None:
            forwarded.append(route)

        async def send(scope: dict[str, Any], body: bytes, hint: RoutingHint):
            if hints is not None:
                hints.append(hint)
            if refuse:
                raise Refused()
            async for messages in run_asgi(apps[route.model], scope, body):
                yield messages

        return send

    def refusal(route: Route, err: Exception) -> APIError | None:
        if not isinstance(err, Refused):
            return None
        return APIError(f"{route.model} is busy", status=503, headers={"Retry-After": "1"})

    cards = [adapter_card("base-lora", "base")]
    return ModelDispatch(model_routes(adapters), "base", forward, refusal, cards)


def client(app: ModelDispatch) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_go_to_their_models_deployment_and_adapters_to_their_base() -> None:
    forwarded: list[Route] = []

    async def go() -> list[dict]:
        async with client(dispatch(forwarded)) as http:
            bodies = []
            for model in ("base", "other", "base-lora"):
                response = await http.post("/v1/completions", json={"model": model, "prompt": "x"})
                assert response.status_code == 200
                bodies.append(response.json())
            return bodies

    bodies = run(go())
    assert [b["served_by"] for b in bodies] == ["base", "other", "base"]
    assert bodies[2]["model"] == "base-lora"  # the body reaches vLLM's app unchanged
    assert forwarded == [Route("base"), Route("other"), Route("base", "base-lora")]


def test_an_unknown_model_is_a_404_naming_the_available_ones() -> None:
    async def go() -> httpx.Response:
        async with client(dispatch()) as http:
            return await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})

    response = run(go())
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "base, base-lora, other" in error["message"]


def test_a_body_without_a_model_goes_to_the_default_model() -> None:
    forwarded: list[Route] = []

    async def go() -> None:
        async with client(dispatch(forwarded)) as http:
            response = await http.post("/v1/completions", json={"prompt": "x"})
            assert response.json()["served_by"] == "base"

    run(go())
    assert forwarded == [Route("base")]


def test_streams_arrive_whole_and_in_order() -> None:
    async def go() -> str:
        async with client(dispatch()) as http:
            response = await http.post(
                "/v1/completions", json={"model": "other", "prompt": "x", "stream": True}
            )
            assert response.headers["content-type"].startswith("text/event-stream")
            return response.text

    assert run(go()) == "".join(f"data: other-{i}\n\n" for i in range(3))


def test_models_lists_every_model_and_adapter_with_its_parent() -> None:
    async def go() -> dict:
        async with client(dispatch()) as http:
            return (await http.get("/v1/models")).json()

    data = run(go())["data"]
    cards = {card["id"]: card["parent"] for card in data}
    assert cards == {"base": None, "base-lora": "base", "other": None}
    assert len(data) == 3  # the router's card, not also the one a replica holding it lists


def test_model_cards_show_no_server_path() -> None:
    """vLLM's cards carry the path a replica loaded (`root`): the router shows names instead."""

    async def go() -> dict:
        async with client(dispatch()) as http:
            return (await http.get("/v1/models")).json()

    roots = {card["id"]: card["root"] for card in run(go())["data"]}
    assert roots == {"base": "base", "base-lora": "base-lora", "other": "other"}


def test_health_reports_each_model() -> None:
    async def go() -> httpx.Response:
        async with client(dispatch()) as http:
            return await http.get("/health")

    response = run(go())
    assert response.status_code == 200
    assert set(response.json()["models"]) == {"base", "other"}


def test_a_full_queue_is_the_models_backpressure_status() -> None:
    async def go() -> httpx.Response:
        async with client(dispatch(refuse=True)) as http:
            return await http.post("/v1/completions", json={"model": "other", "prompt": "x"})

    response = run(go())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "other is busy" in response.json()["error"]["message"]


def test_run_asgi_batches_what_the_app_sent_and_reraises_its_error() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        raise RuntimeError("engine died")

    async def go() -> list[list[dict]]:
        batches = []
        with pytest.raises(RuntimeError, match="engine died"):
            async for batch in run_asgi(app, {"type": "http"}, b""):
                batches.append(batch)
        return batches

    batches = run(go())
    assert [m["type"] for batch in batches for m in batch] == [
        "http.response.start",
        "http.response.body",
    ]


def test_parsed_body_is_a_json_object_or_empty() -> None:
    assert parsed_body(json.dumps({"model": "m"}).encode()) == {"model": "m"}
    assert parsed_body(b"[1, 2]") == {}
    assert parsed_body(b"") == {}
    assert parsed_body(b"\xff") == {}


def test_a_model_that_is_not_a_string_is_a_404() -> None:
    async def go() -> httpx.Response:
        async with client(dispatch()) as http:
            return await http.post("/v1/completions", json={"model": ["base"], "prompt": "x"})

    assert run(go()).status_code == 404


def test_the_request_router_gets_the_prompt_and_session() -> None:
    hints: list[RoutingHint] = []
    messages = [{"role": "user", "content": "hi"}]

    async def go() -> None:
        async with client(dispatch(hints=hints)) as http:
            await http.post("/v1/completions", json={"model": "base", "prompt": "p", "user": "u1"})
            await http.post(
                "/v1/completions",
                json={"model": "base", "messages": messages},
                headers={"x-session-id": "s9"},
            )

    run(go())
    assert hints == [RoutingHint("p", "u1"), RoutingHint(messages, "s9")]

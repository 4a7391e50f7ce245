"""Adapters added and removed at run time on the one endpoint (vLLM's load/unload routes and
bodies): checked by loading into one replica before the name is served, refused clearly when
bad, listed with their parent, and gone after an unload. The real path (Serve handles, vLLM's
loader): tests/integration/multi_model/test_multi_model.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from serving.api.dispatch import ModelDispatch, run_asgi
from serving.api.model_routes import Route, model_routes
from serving.api.runtime_adapters import RuntimeAdapters
from serving.routing import RoutingHint
from tests.unit.api.test_dispatch import model_app


def endpoint(
    allowed: list[str] | None,
    preloaded: list[tuple[Route, str]],
    forwarded: list[Route] | None = None,
) -> ModelDispatch:
    """The endpoint with `allowed` models taking runtime adapters (None: runtime adapters off);
    `forwarded` collects what reached a model's replicas."""
    routes = model_routes({"base": ["base-lora"], "other": []})
    apps = {name: model_app(name, []) for name in ("base", "other")}

    def forward(route: Route):
        if forwarded is not None:
            forwarded.append(route)

        async def send(scope: dict[str, Any], body: bytes, hint: RoutingHint):
            async for messages in run_asgi(apps[route.model], scope, body):
                yield messages

        return send

    async def preload(route: Route, path: str) -> None:
        if path.startswith("/missing"):
            raise RuntimeError(
                f"Traceback ...\nAdapterLoadError: adapter {route.adapter}: no such file {path}"
            )
        preloaded.append((route, path))

    hub_ids = {"base": ["org/base-lora"]}
    runtime = RuntimeAdapters(routes, allowed, preload, hub_ids) if allowed is not None else None
    return ModelDispatch(routes, "base", forward, lambda route, err: None, [], runtime)


def post(app: ModelDispatch, *calls: tuple[str, dict]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return [
                await http.post(path, json=body) if path != "/v1/models" else await http.get(path)
                for path, body in calls
            ]

    return asyncio.run(go())


def test_a_loaded_adapter_is_served_listed_and_gone_after_unload() -> None:
    preloaded: list[tuple[Route, str]] = []
    app = endpoint(["base"], preloaded)
    load, answer, listed, unload, after = post(
        app,
        ("/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": "/adapters/mine"}),
        ("/v1/completions", {"model": "mine", "prompt": "x"}),
        ("/v1/models", {}),
        ("/v1/unload_lora_adapter", {"lora_name": "mine"}),
        ("/v1/completions", {"model": "mine", "prompt": "x"}),
    )
    assert (load.status_code, load.text) == (
        200,
        "Success: LoRA adapter 'mine' added successfully.",
    )
    assert preloaded == [(Route("base", "mine"), "/adapters/mine")]  # checked before it was served
    assert answer.json()["served_by"] == "base" and answer.json()["model"] == "mine"
    cards = {card["id"]: card.get("parent") for card in listed.json()["data"]}
    assert cards["mine"] == "base"
    assert unload.status_code == 200 and "removed" in unload.text
    assert after.status_code == 404 and after.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/load_lora_adapter", {"lora_name": "x"}, 400, "must be provided"),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "base-lora", "lora_path": "/a"},
            400,
            "already been loaded",
        ),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "x", "lora_path": "/a", "model": "other"},
            400,
            "does not take adapters at run time",
        ),
        (
            "/v1/load_lora_adapter",
            {"lora_name": "x", "lora_path": "/missing/x"},
            400,
            "could not be loaded: AdapterLoadError: adapter x: no such file /missing/x",
        ),
        ("/v1/unload_lora_adapter", {"lora_name": "base-lora"}, 400, "in the platform config"),
        ("/v1/unload_lora_adapter", {"lora_name": "nope"}, 404, "cannot be found"),
    ],
)
def test_bad_loads_and_unloads_are_openai_errors(
    path: str, body: dict, status: int, message: str
) -> None:
    (response,) = post(endpoint(["base"], []), (path, body))
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_with_several_models_allowed_the_base_model_must_be_named() -> None:
    preloaded: list[tuple[Route, str]] = []
    app = endpoint(["base", "other"], preloaded)
    unnamed, named = post(
        app,
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/a"}),
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/a", "model": "other"}),
    )
    assert (
        unnamed.status_code == 400 and "name the base model" in unnamed.json()["error"]["message"]
    )
    assert named.status_code == 200 and preloaded == [(Route("other", "x"), "/a")]


def test_load_inplace_is_refused_naming_it() -> None:
    """vLLM's load_inplace replaces a served adapter's weights under the same name."""
    preloaded: list[tuple[Route, str]] = []
    body = {"lora_name": "mine", "lora_path": "/adapters/mine", "load_inplace": True}
    (response,) = post(endpoint(["base"], preloaded), ("/v1/load_lora_adapter", body))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("load_inplace is refused") and error["param"] is None
    assert preloaded == []


@pytest.mark.parametrize("name", ["../etc", "a b", "-x", "x/y"])
def test_an_adapter_name_that_no_model_name_could_be_is_refused(name: str) -> None:
    preloaded: list[tuple[Route, str]] = []
    body = {"lora_name": name, "lora_path": "/adapters/mine"}
    (response,) = post(endpoint(["base"], preloaded), ("/v1/load_lora_adapter", body))
    assert response.status_code == 400 and "lora_name" in response.json()["error"]["message"]
    assert preloaded == []


def test_a_runtime_adapters_card_shows_its_name_or_hub_id_never_its_path() -> None:
    app = endpoint(["base"], [])
    *_, listed = post(
        app,
        ("/v1/load_lora_adapter", {"lora_name": "local", "lora_path": "/srv/adapters/local"}),
        ("/v1/load_lora_adapter", {"lora_name": "hub", "lora_path": "org/base-lora"}),
        ("/v1/models", {}),
    )
    roots = {card["id"]: card["root"] for card in listed.json()["data"]}
    assert roots["local"] == "local" and roots["hub"] == "org/base-lora"


# SageMaker's adapter routes (vLLM adds them with its load route), any other method on the load
# routes, and the load routes themselves when no model takes runtime adapters.
BYPASSES = [
    (allowed, method, path)
    for allowed in (["base"], None)
    for method, path in [("POST", "/adapters"), ("DELETE", "/adapters/base-lora")]
] + [
    (["base"], "GET", "/v1/load_lora_adapter"),
    (None, "POST", "/v1/load_lora_adapter"),
    (None, "POST", "/v1/unload_lora_adapter"),
]


@pytest.mark.parametrize(("allowed", "method", "path"), BYPASSES)
def test_adapter_routes_that_bypass_the_routers_checks_are_never_forwarded(
    allowed: list[str] | None, method: str, path: str
) -> None:
    forwarded: list[Route] = []
    body = {"model": "base", "name": "x", "src": "/tmp/x", "lora_name": "x", "lora_path": "/x"}

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=endpoint(allowed, [], forwarded))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.request(method, path, json=body)

    response = asyncio.run(go())
    assert response.status_code == 404 and forwarded == []
    error = response.json()["error"]
    assert error["type"] == "NotFoundError" and "runtime_adapters" in error["message"]


def test_an_unloaded_name_is_not_loaded_again_with_other_weights() -> None:
    """Replicas keep an adapter until Serve evicts it: the name would serve the old weights."""
    preloaded: list[tuple[Route, str]] = []
    *_, again = post(
        endpoint(["base"], preloaded),
        ("/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": "/adapters/v1"}),
        ("/v1/unload_lora_adapter", {"lora_name": "mine"}),
        ("/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": "/adapters/v2"}),
    )
    assert again.status_code == 400 and "another name" in again.json()["error"]["message"]
    assert preloaded == [(Route("base", "mine"), "/adapters/v1")]

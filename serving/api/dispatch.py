"""One OpenAI endpoint for several models: requests go by their `model` to that model's vLLM
deployment (an adapter's to its base model's) through Serve handles, as ASGI messages; the model's
replica runs vLLM's own app on them (`run_asgi`) and streams the response messages back. So every
route of vLLM's app works for every model, with no second HTTP hop. A replica that dies before
the response starts gets the request once more (Serve picks a live replica), then a 503; after it
started, a stream ends with an OpenAI error event and `[DONE]`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import route_path
from serving.api.errors import APIError, error_body, error_response
from serving.api.model_routes import Route
from serving.routing import RoutingHint, routing_hint
from serving.tracing import spans
from serving.tracing.setup import annotate

if TYPE_CHECKING:
    from serving.api.runtime_adapters import RuntimeAdapters

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
# SageMaker's adapter routes (vLLM registers them with its load/unload routes): never forwarded,
# so an adapter is added only through the router's checks.
SAGEMAKER_ADAPTERS = "/adapters"

# Scope keys a replica needs to run the request; the rest (app, router, state) stays here.
FORWARDED_SCOPE_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "root_path",
    "query_string",
    "headers",
    "server",
    "client",
)

# Models whose deployment runs no replica now (scaled to zero).
ColdModels = Callable[[], Awaitable[set[str]]]


async def _none_cold() -> set[str]:
    return set()


# Sends one request's ASGI messages to a model's deployment (with what its request router may
# use to pick a replica), yielding the response messages.
Forward = Callable[[dict[str, Any], bytes, RoutingHint], AsyncIterator[list[Message]]]


def adapter_routes_off(path: str) -> APIError:
    how = (
        "SageMaker's adapter routes are not served"
        if path != LOAD_PATH and path != UNLOAD_PATH
        else "no model takes adapters at run time"
    )
    return APIError(
        f"{path}: {how}; adapters are added with POST {LOAD_PATH} on a model with "
        "models[].runtime_adapters",
        status=404,
        kind="NotFoundError",
    )


def is_adapter_route(path: str) -> bool:
    return (
        path in (LOAD_PATH, UNLOAD_PATH)
        or path.rstrip("/") == SAGEMAKER_ADAPTERS
        or (path.startswith(SAGEMAKER_ADAPTERS + "/"))
    )


def replica_failed(route: Route, err: Exception) -> APIError:
    """What the client is told when its model's replica failed (the error's type, no details)."""
    return APIError(
        f"the replica serving model {route.model} failed ({type(err).__name__}); retry the request",
        status=503,
        code="replica_failed",
    )


def stream_error_event(error: APIError) -> bytes:
    """An OpenAI error event then `[DONE]`: the end of a stream that cannot go on."""
    event = error_body(error.message, error.status, error.param, error.code, error.kind)
    return f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()


def is_event_stream(start: Message) -> bool:
    headers = Headers(raw=start.get("headers", []))
    return headers.get("content-type", "").startswith("text/event-stream")


def model_not_found(name: Any, available: list[str]) -> APIError:
    return APIError(
        f"The model `{name}` does not exist; available models: {', '.join(available)}",
        status=404,
        param="model",
        code="model_not_found",
        kind="NotFoundError",
    )


def parsed_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; empty when it is none (vLLM's app then says what is wrong)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def forwarded_scope(scope: Scope) -> dict[str, Any]:
    return {key: scope[key] for key in FORWARDED_SCOPE_KEYS if key in scope}


async def read_whole_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise asyncio.CancelledError  # the client went away before its body arrived
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def run_asgi(
    app: ASGIApp, scope: dict[str, Any], body: bytes
) -> AsyncIterator[list[Message]]:
    """Run one request through `app`, yielding its response messages in batches: whatever the
    app sent since the last batch was taken, so a slow consumer gets fewer, larger batches.
    Closing the iterator (the client left) cancels the request in the app."""
    queue: asyncio.Queue[Message | None] = asyncio.Queue()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect until the caller cancels
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        queue.put_nowait(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        done = False
        while not done:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            done = batch[-1] is None
            messages = [m for m in batch if m is not None]
            if messages:
                yield messages
        await task  # re-raise what the app raised
    finally:
        task.cancel()


class ModelDispatch:
    """ASGI app of the one endpoint: `forward(route)` gives the sender of a route's deployment."""

    def __init__(
        self,
        routes: dict[str, Route],
        default_model: str,
        forward: Callable[[Route], Forward],
        on_backpressure: Callable[[Route, Exception], APIError | None],
        adapter_cards: list[dict[str, Any]] | None = None,
        runtime: RuntimeAdapters | None = None,
        replica_lost: Callable[[Exception], bool] = lambda err: False,
        cold_models: ColdModels = _none_cold,
        cold_card: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self.routes = routes
        self.runtime = runtime  # adapters loaded through the API, when a model allows them
        # Replicas load adapters on demand and list only what they hold: the router lists all.
        self.adapter_cards = adapter_cards or []
        self.default_model = default_model
        self.forward = forward
        self.on_backpressure = on_backpressure
        self.replica_lost = replica_lost  # the replica died: the request may go to another
        # A model at zero is listed and reported, not asked (that would start a replica): its
        # card comes from the config.
        self.cold_models = cold_models
        self.cold_card = cold_card or (lambda name: {"id": name, "object": "model"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: nothing to start
        body = await read_whole_body(receive)
        path, method = route_path(scope), scope["method"]
        if method == "GET" and path == "/v1/models":
            await self.list_models(scope, send)
            return
        if method == "GET" and path == "/health":
            await self.health(scope, send)
            return
        data = parsed_body(body)
        if is_adapter_route(path):
            if method == "POST" and path in (LOAD_PATH, UNLOAD_PATH) and self.runtime is not None:
                await self.change_adapters(path, data, scope, send)
            else:
                await error_response(adapter_routes_off(path))(scope, _no_body, send)
            return
        name = data.get("model")
        if name is None:
            route = Route(self.default_model)  # a route without a model: vLLM's default
        elif isinstance(name, str) and name in self.routes:
            route = self.routes[name]
        else:
            await error_response(model_not_found(name, sorted(self.routes)))(scope, receive, send)
            return
        hint = routing_hint(data, Headers(scope=scope))
        annotate(spans.MODEL, route.adapter or route.model)
        await self.relay(route, forwarded_scope(scope), body, hint, send)

    async def relay(
        self, route: Route, scope: dict[str, Any], body: bytes, hint: RoutingHint, send: Send
    ) -> None:
        """The model's response, whatever happens to its replica: never a bare cut."""
        start: Message | None = None
        ended = False
        for attempt in (1, 2):
            try:
                async for messages in self.forward(route)(scope, body, hint):
                    for message in messages:
                        start = message if message["type"] == "http.response.start" else start
                        ended = message["type"] == "http.response.body" and not message.get(
                            "more_body", False
                        )
                        await send(message)
                return
            except Exception as err:
                if start is None and attempt == 1 and self.replica_lost(err):
                    continue  # nothing was sent: the request goes once more, to a live replica
                error = self.on_backpressure(route, err) or replica_failed(route, err)
                if start is None:
                    await error_response(error)(scope, _no_body, send)
                elif not ended:
                    tail = stream_error_event(error) if is_event_stream(start) else b""
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
                return

    async def change_adapters(
        self, path: str, data: dict[str, Any], scope: Scope, send: Send
    ) -> None:
        """vLLM's load/unload routes: plain-text success, OpenAI-shaped errors."""
        assert self.runtime is not None
        try:
            if path == LOAD_PATH:
                text = await self.runtime.load(data)
            else:
                text = self.runtime.unload(data)
        except APIError as err:
            await error_response(err)(scope, _no_body, send)
            return
        await PlainTextResponse(text)(scope, _no_body, send)

    async def collect(self, model: str, scope: Scope) -> tuple[int, bytes]:
        """Status and body of a small GET answered by one model's deployment."""
        status, chunks = 500, []
        try:
            async for messages in self.forward(Route(model))(
                forwarded_scope(scope), b"", RoutingHint()
            ):
                for message in messages:
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    elif message["type"] == "http.response.body":
                        chunks.append(message.get("body", b""))
        except Exception as err:  # a dead replica: this model is unhealthy, not the router
            error = replica_failed(Route(model), err)
            return 503, json.dumps(error_body(error.message, 503, code=error.code)).encode()
        return status, b"".join(chunks)

    async def each_model(self, scope: Scope, cold: set[str]) -> dict[str, tuple[int, bytes]]:
        """Each model's answer to a small GET, but a cold model's (it would wake up)."""
        models = sorted({route.model for route in self.routes.values()} - cold)
        answers = await asyncio.gather(*(self.collect(model, scope) for model in models))
        return dict(zip(models, answers, strict=True))

    async def list_models(self, scope: Scope, send: Send) -> None:
        """vLLM's model cards of every deployment (base models and their adapters, with parent)."""
        cold = await self.cold_models()
        answers = await self.each_model(scope, cold)
        failed = [(status, body) for status, body in answers.values() if status != 200]
        if failed:  # e.g. 401: every deployment checks keys alike
            status, body = failed[0]
            response = JSONResponse(json.loads(body or b"null"), status_code=status)
        else:
            cards = [card for _, body in answers.values() for card in json.loads(body)["data"]]
            # Only the base models' cards of the replicas (their `root` a server path: the name
            # instead), then the adapters the router serves (a replica may still hold one unloaded
            # here, and vLLM's adapter card shows the path it loaded).
            bases = [
                card | {"root": card["id"], "cold": False}
                for card in cards
                if card.get("parent") is None
            ]
            bases += [self.cold_card(name) | {"cold": True} for name in sorted(cold)]
            ours = self.adapter_cards + (self.runtime.cards if self.runtime else [])
            cards = bases + ours
            response = JSONResponse({"object": "list", "data": cards})
        await response(scope, _no_body, send)

    async def health(self, scope: Scope, send: Send) -> None:
        """Healthy when every model's deployment is; the body holds each one's health (a cold
        model's: `{"status": "cold"}`, healthy: its next request starts a replica)."""
        cold = await self.cold_models()
        answers = await self.each_model(scope, cold)
        healthy = all(status == 200 for status, _ in answers.values())
        body = {name: _json_or_text(text) for name, (_, text) in answers.items()}
        body |= {name: COLD_HEALTH for name in cold}
        response = JSONResponse({"models": body}, status_code=200 if healthy else 503)
        await response(scope, _no_body, send)


COLD_HEALTH = {"status": "cold", "running": 0, "waiting": 0}


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}

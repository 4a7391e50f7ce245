"""The model router: the one OpenAI endpoint of a multi-model platform (`models` in the config).
It reads each request's `model` and hands the request to that model's vLLM deployment (the base
model's for an adapter) through a Serve handle; every route of vLLM's app, streaming included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve import Application
from ray.serve.exceptions import BackPressureError
from starlette.types import ASGIApp, Message

from serving.api import cold_start
from serving.api.auth import APIKeyAuth, check_runtime_adapter_keys, key_ring
from serving.api.batch_api import BatchRoutes, batch_app
from serving.api.dispatch import Forward, ModelDispatch, replica_failed
from serving.api.errors import APIError
from serving.api.limits import BodySizeLimit
from serving.api.model_routes import Route, model_routes
from serving.api.runtime_adapters import RuntimeAdapters, adapter_card
from serving.api.usage_routes import UsageRoute, usage_app
from serving.config import PlatformConfig, parse_config
from serving.config import apps as registry
from serving.config.ray_env import drain_deadline_s
from serving.config.replica import BackpressureSettings
from serving.routing import RoutingHint
from serving.state.batches import open_batches
from serving.state.store import open_store
from serving.tracing import spans
from serving.tracing.asgi import TracedRequests, forwarded_at_header
from serving.tracing.setup import start_tracing

VLLM_DEPLOYMENT = "VLLMServer"  # each model's engine deployment (serving.deployments.vllm_server)


def replica_lost(err: Exception) -> bool:
    """The replica's actor died or became unreachable (Serve's handle raises these; its gRPC
    path raises ActorUnavailableError for an UNAVAILABLE call)."""
    return isinstance(err, RayActorError)


def backpressure_settings(config: PlatformConfig, model: str) -> BackpressureSettings:
    return next(m for m in config.models if m.name == model).backpressure


def backpressure_error(config: PlatformConfig, route: Route, err: Exception) -> APIError:
    """A full queue or a wait over max_queue_wait_s, for this model: its status, Retry-After."""
    settings = backpressure_settings(config, route.model)
    return cold_start.refusal(route.model, settings.status_code, settings.retry_after_s, err)


def config_card(config: PlatformConfig, name: str) -> dict[str, Any]:
    """vLLM's model card of a model as the config gives it, for a model at zero (asking its
    deployment would start a replica). vLLM is imported here, not when the router starts."""
    from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelPermission

    entry = next(m for m in config.models if m.name == name)
    card = ModelCard(
        id=name, root=name, max_model_len=entry.model.max_model_len, permission=[ModelPermission()]
    )
    return card.model_dump(mode="json")


def running_replicas(status: Any, apps: dict[str, str]) -> dict[str, int]:
    """Running VLLMServer replicas of each model (`apps`: model -> its Serve app), from
    `serve.status()`; a model whose app Serve does not report is left out (not known)."""
    counts = {}
    for model, app_name in apps.items():
        app = status.applications.get(app_name)
        deployment = app.deployments.get(VLLM_DEPLOYMENT) if app else None
        if deployment is not None:
            states = {getattr(s, "value", s): n for s, n in deployment.replica_states.items()}
            counts[model] = states.get("RUNNING", 0)
    return counts


def adapter_cards(config: PlatformConfig) -> list[dict[str, Any]]:
    """vLLM's model card of every configured adapter (no path on it)."""
    return [
        adapter_card(adapter.name, entry.name)
        for entry in config.models
        for adapter in entry.adapters
    ]


@serve.deployment(
    name=registry.ROUTER_DEPLOYMENT, max_ongoing_requests=4096, health_check_period_s=10
)
@serve.ingress()
class ModelRouter:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = PlatformConfig.model_validate(config)
        self.tracer = start_tracing(self.config.tracing, "router")
        keys = key_ring(self.config.auth)
        check_runtime_adapter_keys(self.config, keys)
        routes = model_routes({m.name: [a.name for a in m.adapters] for m in self.config.models})
        # Serve's gRPC path between replicas (not Ray object refs): measured as fast as plain vLLM.
        self.models = {
            entry.name: serve.get_deployment_handle(VLLM_DEPLOYMENT, entry.app_name).options(
                stream=True, method_name="asgi_call", _by_reference=False
            )
            for entry in self.config.models
        }
        # An adapter's requests carry it as Serve's multiplexed model id: they go to a replica
        # that holds it when one does, which loads it otherwise.
        self.handles = {route: self.handle(route) for route in routes.values()}
        self.routes = routes  # every name a request may use
        allowed = [entry.name for entry in self.config.models if entry.runtime_adapters]
        hub_ids = {entry.name: entry.adapter_hub_ids for entry in self.config.models}
        self.runtime = RuntimeAdapters(routes, allowed, self.preload, hub_ids) if allowed else None
        dispatch = ModelDispatch(
            routes,
            self.config.models[0].name,
            self.forward,
            self.refusal,
            adapter_cards(self.config),
            self.runtime,
            replica_lost,
            self.cold_models,
            lambda name: config_card(self.config, name),
        )
        app: ASGIApp = BodySizeLimit(dispatch, self.config.limits.max_body_bytes)
        if self.config.state.batch.enabled:
            # Batches are served from the store; their lines run on each model's replicas.
            app = BatchRoutes(batch_app(open_batches(self.config.state), self.batch_models), app)
        ledger = usage_app(open_store(self.config.state), open_to_all=not keys.enabled)
        app = UsageRoute(ledger, app)
        app = APIKeyAuth(app, keys)  # with no key configured: the default tenant
        if self.tracer is not None:  # the trace of each request starts (or continues) here
            attributes = {spans.COMPONENT: "router"}
            app = TracedRequests(app, self.tracer, spans.ROUTER_REQUEST, attributes)
        self.asgi = app

    def batch_models(self) -> tuple[set[str], str, set[str] | None]:
        """Every model and adapter a batch line may name, the default one; which embed is
        not known here (a model that does not answers its lines with errors)."""
        return set(self.routes), self.config.models[0].name, None

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return self.asgi

    async def cold_models(self) -> set[str]:
        """Models at zero running replicas now, from Serve's controller; none when it cannot be
        asked (the models are then asked themselves, as before)."""
        apps = {entry.name: entry.app_name for entry in self.config.models}
        try:
            status = await asyncio.to_thread(serve.status)
        except Exception:  # noqa: BLE001 - a status read failing must not fail /v1/models
            return set()
        return {model for model, n in running_replicas(status, apps).items() if n == 0}

    def handle(self, route: Route) -> Any:
        return self.models[route.model].options(multiplexed_model_id=route.adapter or "")

    def forward(self, route: Route) -> Forward:
        handle = self.handles.get(route) or self.handle(route)
        # A runtime adapter's path goes along: any replica may be the first to load it.
        path = self.runtime.paths.get(route.adapter) if self.runtime and route.adapter else None
        wait_s = backpressure_settings(self.config, route.model).max_queue_wait_s

        def send(
            scope: dict[str, Any], body: bytes, hint: RoutingHint
        ) -> AsyncIterator[list[Message]]:
            # Held in Serve's queue while the model has no free replica (at zero: while one
            # starts), up to max_queued_requests requests for up to max_queue_wait_s.
            if self.tracer is not None:  # the replica's serve_queue span starts here
                scope = {**scope, "headers": [*scope["headers"], forwarded_at_header()]}
            return cold_start.held(handle.remote(scope, body, hint, path), wait_s)

        return send

    async def preload(self, route: Route, path: str) -> None:
        """Load a runtime adapter into one replica of its model (raises vLLM's refusal)."""
        handle = self.handle(route).options(stream=False, method_name="add_adapter")
        await handle.remote(route.adapter, path)

    def refusal(self, route: Route, err: Exception) -> APIError | None:
        """A full queue or a wait over the limit: the model's backpressure answer; a lost
        replica: 503 with its Retry-After."""
        if isinstance(err, (BackPressureError, cold_start.QueueWaitExceeded)):
            return backpressure_error(self.config, route, err)
        if not replica_lost(err):
            return None
        error = replica_failed(route, err)
        retry_after = backpressure_error(self.config, route, err).headers
        return APIError(error.message, status=503, code=error.code, headers=retry_after)


def build_router_app(config: PlatformConfig) -> Application:
    # A stopping router replica finishes the streams it forwards, as the models' replicas do.
    router = ModelRouter.options(  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment
        graceful_shutdown_timeout_s=drain_deadline_s(config)
    )
    return router.bind(config.model_dump(mode="json"))


def router_app(args: dict[str, Any]) -> Application:
    """Serve's builder of a multi-model platform's one OpenAI endpoint (models, auth, limits)."""
    return build_router_app(parse_config(args, "serve config args"))

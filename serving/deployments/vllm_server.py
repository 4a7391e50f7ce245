"""The vLLM deployment: each replica runs one vLLM engine and serves it through vLLM's own OpenAI
app (`vllm.entrypoints`: every route and API feature of `vllm serve`), built from the replica's
`vllm serve` options and wrapped with the platform's keys, limits and metrics. One GPU per replica
on GPU clusters. Continuous batching happens inside the engine, so a replica accepts many
requests at once (`max_ongoing_requests`)."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.types import ASGIApp, Message

from serving import deployments
from serving.api.auth import key_ring
from serving.api.batch_api import batch_app, call_json
from serving.api.dispatch import run_asgi
from serving.api.errors import APIError, error_response
from serving.api.fair_share import FairShare
from serving.api.quotas import TenantQuotas
from serving.api.usage import Usage, UsageRecorder
from serving.api.usage_routes import usage_app
from serving.api.vllm_wrap import WrappedApp, wrap_vllm_app
from serving.config import ROUTER_CONFIGS, ConfigError, PlatformConfig, parse_config
from serving.config.access import DEFAULT_TENANT
from serving.config.adapters import AdapterPathRefused, allowed_adapter_path, resolve_adapter_path
from serving.config.ray_env import drain_deadline_s
from serving.deployments.replica import EngineReplica, replica_actor_options
from serving.engines.standby import leave_standby, standby_env
from serving.engines.vllm import VLLMEngine, vllm_env
from serving.engines.vllm_lora import AdapterLoadError, ReplicaAdapters
from serving.engines.vllm_sleep import sleep_when_idle
from serving.engines.vllm_startup import startup_phases
from serving.metrics import MetricLabels, PlatformMetrics, publish_engine_stats
from serving.models import resolve_model
from serving.routing import RoutingHint
from serving.state.batch_runner import BatchRunner
from serving.state.batches import Batches, open_batches
from serving.state.ledger import Tally
from serving.state.responses import keep_responses
from serving.state.store import open_store
from serving.tracing import spans
from serving.tracing.asgi import TracedRequests
from serving.tracing.setup import start_tracing


async def build_vllm_openai_app(engine: VLLMEngine) -> FastAPI:
    """vLLM's OpenAI app over this replica's engine, as `vllm serve` builds it
    (`build_app` + `init_app_state`, the way Ray Serve LLM serves vLLM's native app)."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await engine.llm.get_supported_tasks()
    app = build_app(engine.args, supported_tasks=tasks, model_config=engine.llm.model_config)
    await init_app_state(engine.llm, app.state, engine.args, supported_tasks=tasks)
    # vLLM's engine-error handler flips `should_exit` on the uvicorn server its launcher keeps
    # here; Serve runs no such server (a dead engine fails check_health and the replica is
    # replaced), but the attribute must exist.
    app.state.server = types.SimpleNamespace(should_exit=False)
    return app


@serve.deployment(name="VLLMServer", health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress()
class VLLMServer(EngineReplica):
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self, config: dict[str, Any], behind_router: bool = False
    ) -> None:
        started, init_at = time.perf_counter(), time.time()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        platform = PlatformConfig.model_validate(config)
        model_dir = resolve_model(platform.model.ref, platform.model.cache_dir)
        self.config = with_adapter_dirs(platform, model_dir)
        resolved = time.perf_counter()
        self.metrics = PlatformMetrics(
            MetricLabels("vllm", self.config.model.name, "VLLMServer", self.replica_id),
            adapters=tuple(adapter.name for adapter in self.config.vllm.adapters),
            tenants=tenant_names(self.config),
        )
        # Before the engine: vLLM's engine span goes through this process's tracer.
        tracer = start_tracing(self.config.tracing, "replica")
        # Behind the model router adapters load when a request names one (Serve multiplexing).
        self.engine = VLLMEngine.start(
            self.config, model_dir, self.metrics, preload_adapters=not behind_router
        )
        vllm_app = await build_vllm_openai_app(self.engine)
        self.store = open_store(self.config.state)
        if self.config.state.responses:
            state = self.config.state
            keep_responses(vllm_app, self.store, self.replica_id, state.max_background_responses)
        self.adapters = ReplicaAdapters(
            vllm_app.state.openai_serving_models,
            {adapter.name: adapter.path for adapter in self.config.vllm.adapters},
            self.config.vllm.max_adapters,
            self.metrics.record_adapter_load,
        )
        batches = open_batches(self.config.state) if self.config.state.batch.enabled else None
        self.embeds = "embed" in await self.engine.llm.get_supported_tasks()
        self.openai_app = wrap_vllm_app(
            vllm_app,
            self.engine,
            self.metrics,
            self.config.limits,
            key_ring(self.config.auth),
            batch_app(batches, self.batch_models) if batches else None,
            self.traced_requests(tracer),
            *self.tenant_accounting(),
            usage_app(self.store, open_to_all=not key_ring(self.config.auth).enabled),
        )
        if idle_s := self.config.vllm.engine.sleep_when_idle_s:  # a warm zero (GPU only)
            self.sleeper = sleep_when_idle(self.openai_app, self.engine.llm, idle_s)
        self.batch_runner = self.start_batch_runner(batches, behind_router) if batches else None
        self.engine.startup_timings = {
            "resolve_model": round(resolved - started, 2),
            **self.engine.startup_timings,
            "replica_total": round(time.perf_counter() - started, 2),
        }
        self.engine.startup_at.update(
            # Read through the module: Serve pickles this class by value, with the build
            # process's values of the names it uses.
            platform_imported=deployments.IMPORTED_AT,
            replica_init=init_at,
            replica_ready=time.time(),
        )
        self.metrics.record_startup(startup_phases(self.engine.startup_at))
        self._publisher = asyncio.create_task(publish_engine_stats(self.engine.stats, self.metrics))
        if keep_s := self.config.vllm.engine.standby_worker_s:  # for the next replica here
            self._standby = asyncio.create_task(leave_standby(keep_s, self.engine.in_flight))

    def traced_requests(self, tracer: Any) -> Callable[[ASGIApp], ASGIApp] | None:
        """The replica.request span around the app, when tracing is on."""
        if tracer is None:
            return None
        attributes = {
            spans.COMPONENT: "replica",
            spans.MODEL: self.config.model.name,
            spans.REPLICA: self.replica_id,
        }
        return lambda app: TracedRequests(app, tracer, spans.REPLICA_REQUEST, attributes)

    def tenant_accounting(self) -> tuple[UsageRecorder, Callable[[ASGIApp], ASGIApp] | None]:
        """What each engine request used, for its tenant (the ledger, flushed to the store in
        the background, the tenant counters), and with tenants configured the layers below the
        key check: their rate limits (when any has one) over the fair share of the engine."""
        tally = Tally(self.store)
        self.ledger_flusher = asyncio.create_task(tally.flush_every())
        usage = UsageRecorder(tally, self.store, self.metrics)
        tenants = self.config.auth.tenants
        if not tenants:
            return usage, None
        model = self.config.model.name

        def refused(tenant: str) -> None:
            usage(Usage(tenant, model, "", outcome="refused"))

        def layers(app: ASGIApp) -> ASGIApp:
            weights = {tenant.name: tenant.weight for tenant in tenants}
            fair = FairShare(app, self.config.vllm.engine.max_num_seqs, weights)
            usage.served.append(fair.charge)
            if not any(tenant.rate_limited for tenant in tenants):
                return fair
            return TenantQuotas(fair, self.store, self.replica_id, refused)

        return usage, layers

    def batch_models(self) -> tuple[set[str], str, set[str] | None]:
        """The names a batch line may ask for here, the default one, those that embed."""
        names = {self.config.model.name, *(a.name for a in self.config.vllm.adapters)}
        return names, self.config.model.name, names if self.embeds else set()

    def start_batch_runner(self, batches: Batches, behind_router: bool) -> BatchRunner:
        """This replica's batch runner: lines of its model and adapters, through its own app
        below the API-key check (limits and deadline apply), filling the engine up to
        state.batch.concurrency requests, online ones included."""

        async def prepare(name: str) -> None:
            if behind_router and name in self.adapters.paths:
                await self.adapters.load(name)  # loaded on demand behind the router

        runner = BatchRunner(
            batches,
            self.replica_id,
            lambda: self.batch_models()[0],
            lambda url, body: call_json(self.openai_app.below_keys, url, body),
            self.engine.in_flight,
            prepare,
        )
        runner.start()
        return runner

    def __del__(self) -> None:
        runner = getattr(self, "batch_runner", None)
        if runner is not None:
            runner.stop()  # its lines in flight go back to the other replicas
        super().__del__()

    def __serve_build_asgi_app__(self) -> WrappedApp:
        return self.openai_app

    async def asgi_call(
        self,
        scope: dict[str, Any],
        body: bytes,
        hint: RoutingHint | None = None,
        adapter_path: str | None = None,
    ) -> AsyncIterator[list[Message]]:
        """One HTTP request dispatched by the model router through a Serve handle (no second
        HTTP hop): vLLM's app runs it here and its response messages stream back in batches.
        `hint` is for the request router that picked this replica; `adapter_path` is the path
        of an adapter loaded at run time; the response names the replica in a header."""
        app: Any = self.openai_app
        adapter = serve.get_multiplexed_model_id()
        try:
            if adapter and adapter_path:
                self.adapters.paths[adapter] = self.allowed_path(adapter_path)
            if adapter:
                await self.adapters.load(adapter)
        except (AdapterLoadError, AdapterPathRefused) as err:
            app = error_response(APIError(str(err), status=500, param="model"))
        async for messages in run_asgi(app, scope, body):
            yield [with_replica_header(m, self.replica_id) for m in messages]

    async def add_adapter(self, name: str, path: str) -> None:
        """Load an adapter added at run time (the router checks it here before serving it)."""
        self.adapters.paths[name] = self.allowed_path(path)
        await self.adapters.load(name)

    def allowed_path(self, path: str) -> str:
        """A runtime adapter's path as this replica sees it, if the model's adapter_roots or
        adapter_hub_ids allow it (raises AdapterPathRefused, naming them, otherwise)."""
        settings = self.config.vllm
        return allowed_adapter_path(path, settings.adapter_roots, settings.adapter_hub_ids)

    def record_routing_stats(self) -> dict[str, Any]:
        """What the load_aware request router reads of this replica (Serve's controller polls
        it every request_routing_stats_period_s)."""
        stats = self.engine.stats()
        return {
            "running": stats.running,
            "waiting": stats.waiting,
            "kv_cache_usage": stats.kv_cache_usage,
        }


REPLICA_HEADER = b"x-llm-serving-replica"


def with_replica_header(message: Message, replica_id: str) -> Message:
    """A response start with the replica that served it (which replica a routing policy chose)."""
    if message["type"] != "http.response.start":
        return message
    headers = [*message.get("headers", []), (REPLICA_HEADER, replica_id.encode())]
    return {**message, "headers": headers}


def with_adapter_dirs(config: PlatformConfig, model_dir: Path) -> PlatformConfig:
    """The config with each adapter's path as vLLM loads it (demo adapters built here)."""
    adapters = [
        adapter.model_copy(
            update={"path": resolve_adapter_path(adapter.path, model_dir, config.model.cache_dir)}
        )
        for adapter in config.vllm.adapters
    ]
    return config.model_copy(update={"vllm": config.vllm.model_copy(update={"adapters": adapters})})


@serve.deployment(name="ModelEntry", num_replicas=1, ray_actor_options={"num_cpus": 0})
class ModelEntry:
    """The ingress of one model's app behind the model router. Serve gives every app an ingress,
    and under HAProxy an ingress may not take a custom request router (HAProxy would bypass it);
    so the model's VLLMServer replicas sit behind this idle one, reached by the router's handle,
    with the model's routing policy."""

    def __init__(self, server: DeploymentHandle) -> None:
        self.server = server


def replica_env(config: PlatformConfig) -> dict[str, str]:
    """The replica's runtime-env variables: vLLM's, and the standby worker's import hook."""
    standby = standby_env() if config.vllm.engine.standby_worker_s else {}
    return vllm_env(config) | standby


def tenant_names(config: PlatformConfig) -> tuple[str, ...]:
    """Every tenant a replica may serve: the configured ones and the default."""
    return tuple(dict.fromkeys([DEFAULT_TENANT, *(t.name for t in config.auth.tenants)]))


def build_vllm_app(config: PlatformConfig, behind_router: bool = False) -> Application:
    deployment = config.vllm
    if deployment.runtime_adapters and not behind_router:
        # vLLM's own routes would load any path, unchecked, on one replica only.
        raise ConfigError(
            "vllm.runtime_adapters: adapters are added at run time only through the model "
            "router, which checks them: serve the model as an entry of `models` instead"
        )
    # Behind the router, the model's routing policy picks its replicas (as its serve config says).
    router = {"request_router_config": ROUTER_CONFIGS[deployment.routing]} if behind_router else {}
    server = VLLMServer.options(  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment
        **deployment.replica_options(drain_deadline_s(config)),
        ray_actor_options=replica_actor_options(deployment.resources, replica_env(config)),
        **router,
    ).bind(config.model_dump(mode="json"), behind_router)
    if behind_router:
        return ModelEntry.bind(server)  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment
    return server


def vllm_app(args: dict[str, Any]) -> Application:
    """Serve's builder (serving.config.apps names it): the vLLM app from its part of the platform config."""
    return build_vllm_app(parse_config(args, "serve config args"))


def model_app(args: dict[str, Any]) -> Application:
    """Serve's builder of one model's vLLM deployment behind the model router (`models` entry)."""
    return build_vllm_app(parse_config(args, "serve config args"), behind_router=True)

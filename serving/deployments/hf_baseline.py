"""The transformers baseline deployment: the same OpenAI routes as the vLLM app (`/hf/v1/...`),
served by `HFEngine`. The replica runs one job at a time, so Serve bounds what it accepts
(`max_ongoing_requests`) and what waits for it (`max_queued_requests`); beyond that Serve's proxy
answers 503 with `Retry-After` instead of queueing without bound. With tracing on, each request
is a `replica.request` span (the caller's trace continued), as at a vLLM replica; the baseline has
no engine span below it."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from serving.api.auth import key_ring
from serving.api.routes import build_openai_app
from serving.config import PlatformConfig, parse_config
from serving.config.ray_env import drain_deadline_s
from serving.deployments.replica import EngineReplica, replica_actor_options
from serving.engines.cpu import use_all_cpu_cores
from serving.engines.hf import HFEngine
from serving.metrics import MetricLabels, PlatformMetrics, publish_engine_stats
from serving.models import resolve_model
from serving.tracing import spans
from serving.tracing.asgi import TracedRequests
from serving.tracing.setup import start_tracing


@serve.deployment(name="HFBaseline", health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress()
class HFBaseline(EngineReplica):
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self, config: dict[str, Any]
    ) -> None:
        self.config = PlatformConfig.model_validate(config)
        model_dir = resolve_model(self.config.model.ref, self.config.model.cache_dir)
        if self.config.hf.resources.accelerator == "cpu":
            use_all_cpu_cores()  # Ray would hold torch to one thread
        # Loading takes seconds; off the loop so the replica's event loop stays responsive.
        self.engine = await asyncio.to_thread(HFEngine.load, self.config, model_dir)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.metrics = PlatformMetrics(
            MetricLabels("hf", self.config.model.name, "HFBaseline", self.replica_id)
        )
        self.tracer = start_tracing(self.config.tracing, "replica")
        self._publisher = asyncio.create_task(publish_engine_stats(self.engine.stats, self.metrics))

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = build_openai_app(
            self.engine,
            title="llm-serving (transformers baseline)",
            metrics=self.metrics,
            limits=self.config.limits,
            keys=key_ring(self.config.auth),
        )
        if self.tracer is not None:  # outermost: the span holds the key check and the limits
            attributes = {
                spans.COMPONENT: "replica",
                spans.MODEL: self.config.model.name,
                spans.REPLICA: self.replica_id,
            }
            app.add_middleware(
                TracedRequests,
                tracer=self.tracer,
                name=spans.REPLICA_REQUEST,
                attributes=attributes,
            )
        return app


def build_hf_app(config: PlatformConfig) -> Application:
    deployment = config.hf
    return HFBaseline.options(  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment
        **deployment.replica_options(drain_deadline_s(config)),
        ray_actor_options=replica_actor_options(deployment.resources, {}),
    ).bind(config.model_dump(mode="json"))


def hf_app(args: dict[str, Any]) -> Application:
    """Serve's builder (serving.config.apps names it): the transformers baseline from its config part."""
    return build_hf_app(parse_config(args, "serve config args"))

"""The analysis deployment: the served model loaded with eager attention, opened up over HTTP
(config, modules, GQA shapes, KV-cache math, attention weights, per-token latency). The FastAPI
app is built from a loaded model, so it is tested without Ray."""

from __future__ import annotations

import threading
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import ConfigDict, Field
from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Receive, Scope, Send
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from serving.analysis import AnalysisInputError
from serving.analysis.architecture import (
    attention_layers,
    config_report,
    module_tree,
    shipped_configs,
    shipped_model,
    shipped_report,
)
from serving.analysis.attention import attention_report, load_analysis_model
from serving.analysis.console import console_page
from serving.analysis.kv_cache import kv_cache_report_for
from serving.analysis.latency import generation_trace
from serving.analysis.requests import requests_router
from serving.api.auth import EXEMPT_PATHS, KeyRing, key_ring, route_path
from serving.api.errors import APIError, error_response, install_error_handlers
from serving.api.limits import install_guards
from serving.api.protocol import UnicodeRequest
from serving.config import AnalysisDeploymentConfig, PlatformConfig, parse_config
from serving.config.tracing import TracingConfig
from serving.deployments.replica import replica_actor_options
from serving.engines.cpu import use_all_cpu_cores
from serving.models import resolve_model


class AttentionRequest(UnicodeRequest):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="Text whose attention weights are returned.")
    layers: list[int] | None = Field(None, description="Layer indices; default every layer.")
    heads: list[int] | None = Field(None, description="Head indices; default every head.")
    format: Literal["json", "html"] = Field(
        "json", description="'html' returns bertviz's interactive head view."
    )


class TraceRequest(UnicodeRequest):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="Prompt to decode greedily from.")
    max_new_tokens: int = Field(16, gt=0, description="Tokens to generate (EOS is ignored).")
    mode: Literal["no-cache", "kv-cache"] = Field(
        "kv-cache", description="Re-run the whole sequence each step, or reuse the KV cache."
    )


# The console page holds no model data (it reads the routes with the key typed into it).
CONSOLE_PATHS = frozenset({"/"})
ARCH_QUERY = Query(
    None,
    description="A shipped architecture (GET /architectures) to analyse without weights, "
    "instead of the served model: `analyze --config-only` over HTTP.",
)


class PrefixServesConsole:
    """`/analysis` answers what `/analysis/` does (the console) instead of Starlette's 307 to it:
    the URL `llm-serving up` prints is the page itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope) == "/" and not scope["path"].endswith("/"):
            scope = {
                **scope,
                "path": scope["path"] + "/",
                "raw_path": (scope.get("raw_path") or scope["path"].encode()) + b"/",
            }
        await self.app(scope, receive, send)


def as_api_error(err: AnalysisInputError) -> APIError:
    return APIError(err.message, status=400, param=err.param, code=err.code)


def build_analysis_api(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    settings: AnalysisDeploymentConfig,
    model_name: str,
    default_tokens: int = 2048,
    keys: KeyRing | None = None,
    max_body_bytes: int | None = None,
    tracing: TracingConfig | None = None,
) -> FastAPI:
    """Routes over one loaded model; `settings` holds the request limits, `keys` (when any)
    guard every route but /health and the console page (`/`); `tracing` is where /requests
    reads the platform's spans (off when None or without a query URL)."""
    app = FastAPI(title="llm-serving (analysis)")
    install_error_handlers(app)
    install_guards(app, keys, max_body_bytes, exempt=EXEMPT_PATHS | CONSOLE_PATHS)
    app.add_middleware(PrefixServesConsole)
    report = config_report(model)  # static: computed once per replica
    model_lock = threading.Lock()  # one forward pass at a time: keeps latency traces honest
    app.include_router(requests_router(tracing or TracingConfig()))

    def opened(arch: str | None) -> tuple[str, PreTrainedModel, dict[str, Any]]:
        """Name, model and config report of the served model, or of a shipped architecture."""
        if arch is None:
            return model_name, model, report
        return arch, shipped_model(arch), shipped_report(arch)

    @app.exception_handler(AnalysisInputError)
    async def _bad_input(_: Request, err: AnalysisInputError) -> JSONResponse:
        return error_response(as_api_error(err))

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    @app.get("/", include_in_schema=False)
    def console() -> HTMLResponse:
        return HTMLResponse(console_page())

    @app.get("/architectures")
    def get_architectures() -> dict[str, Any]:
        return {"model": model_name, "shipped": list(shipped_configs())}

    @app.get("/config")
    def get_config(arch: str | None = ARCH_QUERY) -> dict[str, Any]:
        name, _, chosen = opened(arch)
        return {"model": name, **chosen}

    @app.get("/modules")
    def get_modules(
        depth: int | None = Query(None, ge=0), arch: str | None = ARCH_QUERY
    ) -> dict[str, Any]:
        name, chosen, _ = opened(arch)
        return {"model": name, "modules": module_tree(chosen, depth)}

    @app.get("/attention-layers")
    def get_attention_layers(arch: str | None = ARCH_QUERY) -> dict[str, Any]:
        name, chosen, _ = opened(arch)
        return {"model": name, "layers": attention_layers(chosen)}

    @app.get("/kv-cache")
    def get_kv_cache(
        tokens: int = Query(default_tokens, gt=0),
        batch: int = Query(1, gt=0),
        dtype: str = Query("auto"),
        memory_gb: float = Query(1.0, gt=0),
        arch: str | None = ARCH_QUERY,
    ) -> dict[str, Any]:
        name, _, chosen = opened(arch)
        result = kv_cache_report_for(chosen["architecture"], tokens, batch, dtype, memory_gb)
        return {"model": name, **result}

    @app.post("/attention", response_model=None)
    def post_attention(
        body: AttentionRequest, format: Literal["json", "html"] | None = Query(None)
    ) -> dict[str, Any] | HTMLResponse:
        fmt = format or body.format
        with model_lock:
            result = attention_report(
                model,
                tokenizer,
                body.prompt,
                body.layers,
                body.heads,
                fmt,
                settings.max_prompt_tokens,
                settings.max_attention_values,
            )
        if isinstance(result, str):  # fmt "html": the page
            return HTMLResponse(result)
        return {"model": model_name, **result}

    @app.post("/generation-trace")
    def post_generation_trace(body: TraceRequest) -> dict[str, Any]:
        with model_lock:
            result = generation_trace(
                model,
                tokenizer,
                body.prompt,
                body.max_new_tokens,
                body.mode,
                settings.max_prompt_tokens,
                settings.max_new_tokens,
            )
        return {"model": model_name, **result}

    return app


@serve.deployment(name="Analysis", health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress()
class AnalysisServer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = PlatformConfig.model_validate(config)
        model_dir = resolve_model(self.config.model.ref, self.config.model.cache_dir)
        use_all_cpu_cores()  # the model runs on the CPU; Ray would hold torch to one thread
        self.model, self.tokenizer = load_analysis_model(model_dir, self.config.model.dtype)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_analysis_api(
            self.model,
            self.tokenizer,
            self.config.analysis,
            self.config.model.name,
            default_tokens=self.config.model.max_model_len,
            keys=key_ring(self.config.analysis.auth or self.config.auth),
            max_body_bytes=self.config.limits.max_body_bytes,
            tracing=self.config.tracing,
        )


def build_analysis_app(config: PlatformConfig) -> Application:
    deployment = config.analysis
    return AnalysisServer.options(  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment
        max_ongoing_requests=deployment.max_ongoing_requests,
        ray_actor_options=replica_actor_options(deployment.resources, {}),
    ).bind(config.model_dump(mode="json"))


def analysis_app(args: dict[str, Any]) -> Application:
    """Serve's builder (serving.config.apps names it): the analysis app from its config part."""
    return build_analysis_app(parse_config(args, "serve config args"))

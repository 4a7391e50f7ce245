"""Serve application builders of the platform, one per app.

A Serve config names them as `import_path` (e.g. `serving.app:vllm_app`) with the app's own part
of the platform config as `args` (serving.k8s.app_args): the RayService's serveConfigV2, and the
same document `llm-serving up` deploys locally. Serve hashes `args` into the app's code version,
so an app only restarts when its own part changes."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from serving.config import parse_config


def vllm_app(args: dict[str, Any]) -> Application:
    """The vLLM app from its part of the platform config (model, vllm, auth, limits)."""
    from serving.deployments.vllm_server import build_vllm_app

    return build_vllm_app(parse_config(args, "serve config args"))


def model_app(args: dict[str, Any]) -> Application:
    """One model's vLLM deployment behind the model router (an entry of `models`)."""
    from serving.deployments.vllm_server import build_vllm_app

    return build_vllm_app(parse_config(args, "serve config args"), behind_router=True)


def hf_app(args: dict[str, Any]) -> Application:
    """The transformers baseline from its part of the platform config (model, hf, auth, limits)."""
    from serving.deployments.hf_baseline import build_hf_app

    return build_hf_app(parse_config(args, "serve config args"))


def analysis_app(args: dict[str, Any]) -> Application:
    """The analysis app from its part of the platform config (model, analysis, auth, limits)."""
    from serving.deployments.analysis import build_analysis_app

    return build_analysis_app(parse_config(args, "serve config args"))


def router_app(args: dict[str, Any]) -> Application:
    """The one OpenAI endpoint of a multi-model platform (models, auth, limits)."""
    from serving.deployments.model_router import build_router_app

    return build_router_app(parse_config(args, "serve config args"))

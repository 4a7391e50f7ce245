"""Serve applications of the platform, built from one PlatformConfig.

`llm-serving up` runs them locally; a RayService names the builders below as `import_path`
(e.g. `serving.app:vllm_app`) with the platform config as `args`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.serve import Application

from serving.config import PlatformConfig, parse_config


@dataclass(frozen=True)
class AppSpec:
    name: str
    route_prefix: str
    import_path: str
    application: Application


def build_apps(config: PlatformConfig) -> list[AppSpec]:
    """Every enabled application, each with its own route prefix."""
    from serving.deployments.vllm_server import build_vllm_app

    apps = []
    if config.vllm.enabled:
        apps.append(
            AppSpec("vllm", config.vllm.route_prefix, "serving.app:vllm_app", build_vllm_app(config))
        )
    if config.hf.enabled:
        from serving.deployments.hf_baseline import build_hf_app

        apps.append(AppSpec("hf", config.hf.route_prefix, "serving.app:hf_app", build_hf_app(config)))
    if config.analysis.enabled:
        from serving.deployments.analysis import build_analysis_app

        apps.append(
            AppSpec(
                "analysis", config.analysis.route_prefix, "serving.app:analysis_app",
                build_analysis_app(config),
            )
        )
    return apps


def vllm_app(args: dict[str, Any]) -> Application:
    """Serve application builder for the vLLM app (`args` = a PlatformConfig as a dict)."""
    from serving.deployments.vllm_server import build_vllm_app

    return build_vllm_app(parse_config(args, "serve config args"))


def hf_app(args: dict[str, Any]) -> Application:
    """Serve application builder for the transformers baseline (`args` = a PlatformConfig dict)."""
    from serving.deployments.hf_baseline import build_hf_app

    return build_hf_app(parse_config(args, "serve config args"))


def analysis_app(args: dict[str, Any]) -> Application:
    """Serve application builder for the analysis app (`args` = a PlatformConfig as a dict)."""
    from serving.deployments.analysis import build_analysis_app

    return build_analysis_app(parse_config(args, "serve config args"))

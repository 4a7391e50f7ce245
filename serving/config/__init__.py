"""The platform config: one typed pydantic model (`PlatformConfig`) and its parts, a module each.

It is the single source every layer reads (local runs, the RayService serve config, the chart's
values schema, the LLMService CRD) and imports none of them. `platform` holds the whole config and
its loaders; the parts are `replica` (scaling, start-up, drain), `access` (keys, limits), `state`
(the store), `tracing`, `ray` (ports, Ray's own settings), `ray_env` (what those put into every Ray
process's environment), `apps` (the registry of Serve apps) and `adapters` (LoRA adapter sources).
"""

from serving.config.platform import (
    ROUTER_CONFIGS,
    AdapterConfig,
    AnalysisDeploymentConfig,
    ConfigError,
    HFDeploymentConfig,
    ModelConfig,
    PlatformConfig,
    ServedModelConfig,
    VLLMDeploymentConfig,
    VLLMReplicaSettings,
    format_validation_error,
    load_config,
    parse_config,
)

__all__ = [
    "ROUTER_CONFIGS",
    "AdapterConfig",
    "AnalysisDeploymentConfig",
    "ConfigError",
    "HFDeploymentConfig",
    "ModelConfig",
    "PlatformConfig",
    "ServedModelConfig",
    "VLLMDeploymentConfig",
    "VLLMReplicaSettings",
    "format_validation_error",
    "load_config",
    "parse_config",
]

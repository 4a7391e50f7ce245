"""PlatformConfig: the one typed source for local runs, the RayService serve config, the chart's
values schema and the operator's CRD spec. Unknown keys fail; every field says what it is for."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from serving.config.access import AuthConfig, RequestLimits
from serving.config.apps import App, apps_of
from serving.config.ray import HTTPConfig, RayConfig
from serving.config.replica import (
    BackpressureSettings,
    ReplicaResources,
    ReplicaScaling,
    StrictModel,
    VLLMEngineConfig,
)
from serving.config.state import StateConfig
from serving.config.tracing import TracingConfig

DType = Literal["auto", "bfloat16", "float16", "float32"]


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the field path."""


class ModelConfig(StrictModel):
    ref: str = Field(
        "default",
        description="Model to serve: a Hugging Face id, a local directory, 'default' (the embedded "
        "SmolLM2-135M-Instruct) or 'tiny-qwen2' (a random-weight Qwen2 for tests).",
    )
    served_name: str | None = Field(
        None, description="Name clients pass as `model`; defaults to the model reference."
    )
    dtype: DType = Field("auto", description="Weights and activations dtype for every engine.")
    max_model_len: int = Field(2048, gt=0, description="Longest prompt + completion in tokens.")
    cache_dir: str | None = Field(
        None,
        description="Where built models (embedded default, tiny test model) are cached; "
        "defaults to $LLM_SERVING_CACHE or ~/.cache/llm-serving.",
    )

    @property
    def name(self) -> str:
        return self.served_name or self.ref


class AdapterConfig(StrictModel):
    name: str = Field(
        ..., min_length=1, description="Name clients pass as `model` to use the adapter."
    )
    path: str = Field(
        ...,
        min_length=1,
        description="The LoRA adapter: a local directory (as `peft` saves one) "
        "or a Hugging Face id.",
    )


RoutingPolicy = Literal["power_of_two", "prefix_cache", "session", "load_aware", "random"]
# Serve's `request_router_config` of each policy (serving/routing.py says what each does;
# power_of_two is Serve's default with its decisions traced). load_aware reads each engine's
# KV-cache use every second (Serve's default: every 10 s).
ROUTER_CONFIGS: dict[str, dict[str, Any]] = {
    "power_of_two": {"request_router_class": "serving.routing:PowerOfTwoRouter"},
    "prefix_cache": {"request_router_class": "serving.routing:PrefixAffinityRouter"},
    "session": {"request_router_class": "serving.routing:SessionAffinityRouter"},
    "load_aware": {
        "request_router_class": "serving.routing:LoadAwareRouter",
        "request_routing_stats_period_s": 1.0,
    },
    "random": {"request_router_class": "serving.routing:RandomRouter"},
}


class VLLMReplicaSettings(ReplicaScaling):
    """What one model's vLLM deployment runs: engine, `vllm serve` options, LoRA adapters."""

    max_ongoing_requests: int = Field(
        256, gt=0, description="Requests one replica accepts at once; high so vLLM can batch them."
    )
    engine: VLLMEngineConfig = Field(
        default_factory=VLLMEngineConfig, description="vLLM engine arguments."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other `vllm serve` option by name, as in a `vllm serve --config` YAML "
        "(e.g. enable_auto_tool_choice: true, tool_call_parser: hermes, chat_template, "
        "reasoning_parser, max_logprobs, enable_prefix_caching, max_lora_rank). vLLM's own "
        "parser checks them: an unknown option or a bad value fails at start with vLLM's message.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    adapters: list[AdapterConfig] = Field(
        default_factory=list,
        description="LoRA adapters of this model, each served under its own name (vLLM's "
        "`lora_modules`); any adapter turns on vLLM's LoRA support.",
    )
    max_adapters: int = Field(
        4, gt=0, description="Adapters one replica's engine holds at once (vLLM's max_loras)."
    )
    runtime_adapters: bool = Field(
        False,
        description="Allow adding LoRA adapters while it runs (POST /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter with vLLM's bodies, on the `models` endpoint only), from "
        "adapter_roots or adapter_hub_ids; needs API keys (auth.api_keys or auth.api_keys_env).",
    )
    adapter_roots: list[str] = Field(
        default_factory=list,
        description="Directories on the replicas that runtime adapters may load from: a "
        "`lora_path` must lie under one once links are resolved.",
    )
    adapter_hub_ids: list[str] = Field(
        default_factory=list,
        description="Hugging Face ids that runtime adapters may load (exact `lora_path` values).",
    )

    @model_validator(mode="after")
    def _check_engine_device(self) -> VLLMReplicaSettings:
        self.engine.check_device(self.resources.accelerator)
        return self

    @model_validator(mode="after")
    def _check_runtime_adapters(self) -> VLLMReplicaSettings:
        if self.runtime_adapters and not (self.adapter_roots or self.adapter_hub_ids):
            raise ValueError(
                "runtime_adapters needs adapter_roots or adapter_hub_ids (where adapters may "
                "be loaded from; any path was accepted before)"
            )
        return self

    routing: RoutingPolicy = Field(
        "power_of_two",
        description="How requests through the `models` endpoint pick a replica of this model: "
        "power_of_two (the less loaded of two), prefix_cache (the replica whose KV cache likely "
        "holds the prompt's prefix, Ray's PrefixCacheAffinityRouter), session (one replica per "
        "`x-session-id` header or OpenAI `user`), load_aware (the lowest score of ongoing "
        "requests and KV-cache use), random (any replica: a baseline for measurements). "
        "power_of_two, session and load_aware prefer a replica holding the request's adapter.",
    )


class VLLMDeploymentConfig(VLLMReplicaSettings):
    enabled: bool = Field(True, description="Serve the vLLM application.")
    route_prefix: str = Field(
        "/", description="HTTP prefix; the OpenAI routes sit under it at /v1."
    )


class ServedModelConfig(VLLMReplicaSettings):
    """One model of a multi-model platform: its own vLLM deployment behind the one endpoint."""

    name: str = Field(
        ...,
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name clients pass as `model` (letters, digits, '.', '_', '-'); also names "
        "its Serve application (`vllm-NAME`).",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model (its served_name is `name`)."
    )

    @property
    def app_name(self) -> str:
        """The Serve application of this model's deployment (no route of its own)."""
        return f"vllm-{self.name}"


HFMode = Literal["generate", "no-cache", "kv-cache", "static-batch"]


class HFDeploymentConfig(ReplicaScaling):
    enabled: bool = Field(True, description="Serve the transformers baseline application.")
    route_prefix: str = Field(
        "/hf", description="HTTP prefix; the OpenAI routes sit under it at /v1."
    )
    max_ongoing_requests: int = Field(
        8,
        gt=0,
        description="Requests one replica works on at once (the baseline does not batch "
        "continuously; static-batch mode batches what arrives within a window).",
    )
    backpressure: BackpressureSettings = Field(
        default_factory=lambda: BackpressureSettings(max_queued_requests=32),
        description="Bounded queue in front of replicas: beyond it 503 with Retry-After.",
    )
    mode: HFMode = Field(
        "generate",
        description="Default generation mode: transformers generate(), a no-cache loop, a "
        "KV-cache loop, or static padded batches. Requests may pick another (extension field).",
    )
    batch_window_ms: float = Field(
        50.0, ge=0, description="static-batch: how long to collect requests into one batch."
    )
    max_batch_size: int = Field(8, gt=0, description="static-batch: most requests per batch.")


class AnalysisDeploymentConfig(StrictModel):
    enabled: bool = Field(True, description="Serve the analysis application.")
    route_prefix: str = Field("/analysis", description="HTTP prefix of the analysis routes.")
    max_prompt_tokens: int = Field(
        256, gt=0, description="Longest prompt the attention and trace routes accept (costly)."
    )
    max_new_tokens: int = Field(
        64, gt=0, description="Most tokens one generation-trace request may generate."
    )
    max_attention_values: int = Field(
        2_000_000,
        gt=0,
        description="Most attention weights (layers x heads x prompt tokens^2) one attention "
        "answer may carry; bounds the JSON/HTML size. Select layers/heads to stay under it.",
    )
    max_ongoing_requests: int = Field(
        4, gt=0, description="Requests one analysis replica accepts at once (each is CPU-heavy)."
    )
    auth: AuthConfig | None = Field(
        None, description="API keys of the analysis app alone; unset = the platform's `auth`."
    )
    resources: ReplicaResources = Field(
        default_factory=ReplicaResources, description="Resources of each replica."
    )


class PlatformConfig(StrictModel):
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model every app serves."
    )
    http: HTTPConfig = Field(default_factory=HTTPConfig, description="Serve's HTTP proxy.")
    ray: RayConfig = Field(default_factory=RayConfig, description="The local Ray head (`up`).")
    # The Serve apps: each field's App entry names its builder and deployment (serving/config/apps.py).
    vllm: Annotated[
        VLLMDeploymentConfig,
        App("serving.deployments.vllm_server:vllm_app", "VLLMServer", state=True, traced=True),
    ] = Field(default_factory=VLLMDeploymentConfig, description="The vLLM application.")
    hf: Annotated[
        HFDeploymentConfig,
        App("serving.deployments.hf_baseline:hf_app", "HFBaseline", traced=True),
    ] = Field(
        default_factory=HFDeploymentConfig, description="The transformers baseline application."
    )
    analysis: Annotated[
        AnalysisDeploymentConfig,
        App("serving.deployments.analysis:analysis_app", "Analysis", scaled=False, traced=True),
    ] = Field(
        default_factory=AnalysisDeploymentConfig, description="The model analysis application."
    )
    auth: AuthConfig = Field(
        default_factory=AuthConfig, description="API keys of every app (analysis may have its own)."
    )
    limits: RequestLimits = Field(
        default_factory=RequestLimits, description="Per-request limits of the OpenAI routes."
    )
    state: StateConfig = Field(
        default_factory=StateConfig,
        description="The store of stored responses, files and batches, shared by every replica.",
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig,
        description="OpenTelemetry traces of every request (router, replica, vLLM's engine).",
    )
    models: list[ServedModelConfig] = Field(
        default_factory=list,
        description="Several models (each with its own vLLM deployment, adapters and scaling) "
        "behind the one OpenAI endpoint at vllm.route_prefix, which dispatches by the request's "
        "`model`. Empty: the one `model` served with the `vllm` settings.",
    )

    @model_validator(mode="after")
    def _check_models(self) -> PlatformConfig:
        if not self.models:
            return self
        # Compared with the defaults, not by fields set: a dumped-and-reloaded config sets all.
        default = VLLMDeploymentConfig()
        shared = [
            key
            for key in VLLMReplicaSettings.model_fields
            if getattr(self.vllm, key) != getattr(default, key)
        ]
        if shared:
            raise ValueError(f"vllm.{sorted(shared)[0]}: with `models`, set it on each model")
        seen: dict[str, str] = {}
        for index, entry in enumerate(self.models):
            if entry.runtime_adapters and not (self.auth.api_keys or self.auth.api_keys_env):
                raise ValueError(
                    f"models[{index}].runtime_adapters needs API keys: set auth.api_keys or "
                    "auth.api_keys_env"
                )
            names = [entry.name] + [adapter.name for adapter in entry.adapters]
            for name in names:
                if name in seen:
                    raise ValueError(
                        f"models[{index}] ({entry.name}): the name {name!r} is already taken by "
                        f"{seen[name]}; model and adapter names must differ"
                    )
                seen[name] = f"models[{index}]"
        return self

    def model_platform(self, entry: ServedModelConfig) -> PlatformConfig:
        """The single-model platform config of one entry of `models`, as its deployment runs it."""
        settings = entry.model_dump(exclude={"name", "model"}, exclude_unset=True)
        # Only the sections this config sets: the model's serve config args then carry what
        # was written (as every app's do), and the chart renders the same args.
        shared = {
            key: getattr(self, key)
            for key in ("auth", "limits", "http", "ray", "state", "tracing")
            if key in self.model_fields_set
        }
        return PlatformConfig(
            model=entry.model.model_copy(update={"served_name": entry.name}),
            vllm=VLLMDeploymentConfig.model_validate(settings),
            **shared,
        )

    def platform_of(self, name: str) -> PlatformConfig:
        """The single-model config serving `name` (an entry of `models`, else this config)."""
        entry = next((m for m in self.models if m.name == name), None)
        return self if entry is None else self.model_platform(entry)

    @model_validator(mode="after")
    def _check_route_prefixes(self) -> PlatformConfig:
        prefixes = {app.name: getattr(self, app.name).route_prefix for app in apps_of(self)}
        for name, prefix in prefixes.items():
            if not prefix.startswith("/"):
                raise ValueError(f"{name}.route_prefix must start with '/'")
        if len(set(prefixes.values())) != len(prefixes):
            raise ValueError(f"route prefixes must differ: {prefixes}")
        return self


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each naming the field path, e.g. `vllm.num_replicas: ...`."""
    problems = []
    for item in err.errors():
        path = ".".join(str(part) for part in item["loc"]) or "<root>"
        problems.append(f"{path}: {item['msg']}")
    return f"invalid config {source}: " + "; ".join(problems)


def parse_config(data: dict[str, Any] | None, source: str = "<dict>") -> PlatformConfig:
    try:
        return PlatformConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path | None = None) -> PlatformConfig:
    """Load a YAML config file; None loads the default that ships in the package."""
    if path is None:
        text = resources.files("serving").joinpath("default.yaml").read_text()
        source = "serving/default.yaml"
    else:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror}") from None
        source = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config {source} is not valid YAML: {err}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config {source} must be a mapping at the top level")
    return parse_config(data, source)

"""The `LLMService` resource, typed: its spec (PlatformConfig + cluster knobs) and its status.

These pydantic models are the one source of the CRD's schema (`operators.crd`) and of the
operator's validation, so `kubectl apply` and the operator reject the same things."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serving.config import PlatformConfig, format_validation_error
from serving.config.access import DEFAULT_TENANT
from serving.k8s.gpu_workers import gpu_demand, surge_gpus
from serving.k8s.serve_config import inline_key_settings
from serving.k8s.values_schema import RayAuthMode, UpgradeStrategy

GROUP = "serving.llm-serving.io"
VERSION = "v1alpha1"
KIND = "LLMService"
PLURAL = "llmservices"
MAX_NAME_LENGTH = 47  # KubeRay's limit on a RayService name (the LLMService's name)
SINGULAR = "llmservice"
SHORT_NAMES = ["llmsvc"]

Quantity = int | str  # a Kubernetes resource quantity: 4, "16Gi", "500m"


class SpecError(ValueError):
    """An LLMService spec the operator cannot serve; the message names the field path."""


class CamelModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class WorkerBounds(CamelModel):
    min: int | None = Field(
        None,
        ge=0,
        description="Worker pods at start and the fewest the autoscaler keeps. Unset: one pod "
        "at start; the fewest 0 on GPU workers when every GPU app may scale to zero "
        "(min_replicas 0), else 1.",
    )
    max: int = Field(4, ge=1, description="Most worker pods KubeRay's autoscaler may create.")

    @model_validator(mode="after")
    def _check_bounds(self) -> WorkerBounds:
        if self.min is not None and self.min > self.max:
            raise ValueError(f"workers.min ({self.min}) must not exceed workers.max ({self.max})")
        return self


class ContainerResources(CamelModel):
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Requests of each worker container, e.g. cpu: 4, memory: 24Gi.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Limits of each worker container; nvidia.com/gpu is set from gpusPerReplica.",
    )


class SecretKeyRef(CamelModel):
    name: str = Field(min_length=1, description="Name of a Secret in the LLMService's namespace.")
    key: str = Field("api-keys", min_length=1, description="Key inside the Secret.")


class PasswordSecretRef(CamelModel):
    name: str = Field(min_length=1, description="Name of a Secret in the LLMService's namespace.")
    key: str = Field("password", min_length=1, description="Key of the password inside the Secret.")


class TokenSecretRef(CamelModel):
    name: str = Field(min_length=1, description="Name of a Secret in the LLMService's namespace.")
    key: str = Field("HF_TOKEN", min_length=1, description="Key of the token inside the Secret.")


class LocalObjectReference(CamelModel):
    name: str = Field(min_length=1, description="Name of the object in the same namespace.")


class IncrementalUpgrade(CamelModel):
    """KubeRay's clusterUpgradeOptions (the chart's ray.incrementalUpgrade)."""

    gateway_class_name: str = Field(
        alias="gatewayClassName",
        min_length=1,
        description="GatewayClass of the Gateway KubeRay creates (a Gateway API controller).",
    )
    step_size_percent: int = Field(
        25, ge=1, le=100, alias="stepSizePercent", description="Traffic moved per step, percent."
    )
    interval_seconds: int = Field(30, ge=1, alias="intervalSeconds", description="Between steps.")
    max_surge_percent: int = Field(
        100,
        ge=1,
        le=100,
        alias="maxSurgePercent",
        description="Most capacity added per step, percent of the old cluster's.",
    )


class Toleration(CamelModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(None, description="Taint key; unset with operator Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; unset: every effect."
    )
    toleration_seconds: int | None = Field(
        None, alias="tolerationSeconds", description="NoExecute: how long the pod stays bound."
    )


class PodSettings(CamelModel):
    """Pod settings of the RayService (the chart's values of the same names): a private registry,
    a gated model's token, the shared model cache, and where the worker group runs."""

    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        alias="imagePullSecrets",
        description="Secrets for pulling the image from a private registry (every Ray pod).",
    )
    hf_token_secret: TokenSecretRef | None = Field(
        None,
        alias="hfTokenSecret",
        description="Secret with a Hugging Face token (gated models), mounted as a file that "
        "every Ray and prefetch container reads through HF_TOKEN_PATH.",
    )
    model_cache_claim: str | None = Field(
        None,
        alias="modelCacheClaim",
        min_length=1,
        description="An existing PersistentVolumeClaim for the model cache of every worker "
        "(weights download once per cluster); unset: an emptyDir per pod.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector", description="Node selector of worker pods."
    )
    tolerations: list[Toleration] | None = Field(
        None,
        description="Tolerations of worker pods; unset: the nvidia.com/gpu NoSchedule taint on "
        "GPU workers, none on CPU workers.",
    )
    runtime_class_name: str | None = Field(
        None,
        alias="runtimeClassName",
        description="RuntimeClass of worker pods (e.g. nvidia where it is not the default).",
    )
    priority_class_name: str | None = Field(
        None, alias="priorityClassName", description="Priority class of worker pods."
    )


class LLMServiceSpec(CamelModel):
    platform: PlatformConfig = Field(
        default_factory=PlatformConfig,
        description="The platform config (serving.config.PlatformConfig): model, engines, "
        "autoscaling on queue depth, backpressure. Same keys as the chart's `platform` values.",
    )
    image: str = Field(
        description="Image of every Ray container: Ray 2.60 with the llm-serving package installed."
    )
    gpus_per_replica: int = Field(
        1,
        ge=0,
        alias="gpusPerReplica",
        description="GPUs of each worker pod (nvidia.com/gpu). Each vLLM replica takes one GPU, "
        "so a worker hosts this many replicas; 0 runs CPU-only workers.",
    )
    workers: WorkerBounds = Field(
        default_factory=WorkerBounds, description="Size bounds of the worker group."
    )
    resources: ContainerResources | None = Field(
        None,
        description="CPU and memory of each worker container; unset: the chart's defaults "
        "(4 CPUs, 24Gi with GPUs, 16Gi without).",
    )
    api_key_secret: SecretKeyRef | None = Field(
        None,
        alias="apiKeySecret",
        description="Secret with the API keys every app accepts (comma-separated); Ray "
        "containers get them in platform.auth.api_keys_env. Unset: no keys from a Secret.",
    )
    tenant_key_secrets: dict[str, SecretKeyRef] = Field(
        default_factory=dict,
        alias="tenantKeySecrets",
        description="Per tenant of platform.auth.tenants, the Secret with its API keys "
        "(comma-separated); Ray containers get them in the tenant's api_keys_env (unset: "
        "LLM_SERVING_TENANT_<NAME>_KEYS, NAME upper-cased with '-' as '_').",
    )
    state_secret: PasswordSecretRef | None = Field(
        None,
        alias="stateSecret",
        description="Secret with the password of the PostgreSQL server that platform.state.url "
        "names (the store of stored responses, files and batches); Ray containers get it in "
        "platform.state.password_env. Without platform.state.url each worker pod keeps its own "
        "SQLite store, which the other pods do not see: set both for more than one pod.",
    )
    ray_auth: RayAuthMode = Field(
        "token",
        alias="rayAuth",
        description="Ray's token authentication (KubeRay's authOptions.mode, KubeRay >= 1.6): "
        "with token, the Ray dashboard (job submission), client and GCS want the token KubeRay "
        "keeps in a Secret named after the RayCluster (key auth_token); disabled: no token.",
    )
    network_policy: bool = Field(
        True,
        alias="networkPolicy",
        description="A NetworkPolicy over the Ray pods (the chart's networkPolicy): Serve's HTTP "
        "port from anywhere, metrics from the monitoring namespace and this operator, the "
        "dashboard from KubeRay's operator, Ray's own ports only from the service's Ray pods.",
    )
    pods: PodSettings = Field(
        default_factory=PodSettings,
        description="Registry, token, model cache and placement of the Ray pods.",
    )
    upgrade_strategy: UpgradeStrategy = Field(
        "NewCluster",
        alias="upgradeStrategy",
        description="KubeRay's RayService upgradeStrategy.type: how a change of the cluster "
        "(image, resources, pods, worker bounds) is applied. NewCluster: a second RayCluster "
        "takes over once its apps serve (zero downtime, twice the resources meanwhile).",
    )

    incremental_upgrade: IncrementalUpgrade | None = Field(
        None,
        alias="incrementalUpgrade",
        description="With upgradeStrategy NewClusterWithIncrementalUpgrade (KubeRay >= 1.7, a "
        "Gateway API controller): traffic moves to the new cluster in steps while it scales up.",
    )

    @model_validator(mode="after")
    def _check_incremental_upgrade(self) -> LLMServiceSpec:
        if self.upgrade_strategy == "NewClusterWithIncrementalUpgrade" and not (
            self.incremental_upgrade
        ):
            raise ValueError(
                "upgradeStrategy NewClusterWithIncrementalUpgrade needs incrementalUpgrade "
                "(at least gatewayClassName: the GatewayClass of your Gateway API controller)"
            )
        return self

    @model_validator(mode="after")
    def _check_state_secret(self) -> LLMServiceSpec:
        if self.state_secret is not None and not self.platform.state.url:
            raise ValueError(
                "stateSecret is the password of the server platform.state.url names: set "
                "platform.state.url (postgresql+psycopg://USER@HOST:5432/DB)"
            )
        return self

    @model_validator(mode="after")
    def _check_keys(self) -> LLMServiceSpec:
        """Keys only from Secrets, a tenant's for a tenant of the platform (the chart's rules)."""
        if settings := inline_key_settings(self.platform):
            where = ", ".join(f"platform.{s}" for s in settings)
            raise ValueError(
                f"{where}: API keys written in the spec would travel in the RayService's serve "
                "config, readable on the Ray dashboard; put them in a Secret named by apiKeySecret "
                "(a tenant's: by tenantKeySecrets.<tenant>) and remove them from the platform"
            )
        known = {tenant.name for tenant in self.platform.auth.tenants} - {DEFAULT_TENANT}
        if unknown := sorted(self.tenant_key_secrets.keys() - known):
            raise ValueError(
                f"tenantKeySecrets: {', '.join(unknown)}: no such tenant in platform.auth.tenants "
                f"(the tenant {DEFAULT_TENANT}'s keys are apiKeySecret's)"
            )
        return self

    @model_validator(mode="after")
    def _check_gpu_capacity(self) -> LLMServiceSpec:
        """The chart's rules (templates/_validate.tpl): GPU apps need GPU workers, and enough."""
        demand = gpu_demand(self.platform)
        capacity = self.workers.max * self.gpus_per_replica
        if demand and not self.gpus_per_replica:
            raise ValueError(
                f"apps with resources.accelerator=gpu need {demand} GPU(s) but gpusPerReplica is "
                "0: set gpusPerReplica >= 1 or the apps' accelerator to cpu"
            )
        if demand > capacity:
            raise ValueError(
                f"Serve may run {demand} GPU replica(s) but workers.max x gpusPerReplica = "
                f"{capacity}: raise workers.max or lower the apps' replicas"
            )
        return self


def surge_shortfall(spec: LLMServiceSpec) -> str | None:
    """Why a rolling update at full scale would wait for a GPU (the chart's install note), or None."""
    demand, surge = gpu_demand(spec.platform), surge_gpus(spec.platform)
    capacity = spec.workers.max * spec.gpus_per_replica
    if not surge or demand + surge <= capacity:
        return None
    return (
        f"a rolling update at full scale starts {surge} surge replica(s) beside the {demand} GPU "
        f"replica(s) Serve may run: {demand + surge} GPUs, but workers.max x gpusPerReplica = "
        f"{capacity}; the new replicas wait (old ones keep serving) until load drops. Raise "
        "workers.max, or set that app's max_surge_percent: 0"
    )


def unshared_state(spec: LLMServiceSpec) -> str | None:
    """Why stored responses and batches would not be shared between replicas (each worker pod
    keeps its own SQLite file without platform.state.url: the chart refuses that, the operator,
    which deploys no database, warns), or None."""
    state = spec.platform.state
    if (state.url or "").startswith("postgresql") or spec.workers.max <= 1:
        return None
    if not (state.responses or state.batch.enabled):
        return None
    return (
        f"up to {spec.workers.max} worker pods may run replicas, and without a PostgreSQL "
        "platform.state.url each keeps its own stored responses and batches: a follow-up or a "
        "batch poll that reaches another pod finds nothing. Set platform.state.url and "
        "stateSecret, or platform.state.responses: false and platform.state.batch.enabled: false"
    )


def parse_spec(spec: dict | None) -> LLMServiceSpec:
    """Validate a resource's spec; SpecError carries one readable line per problem."""
    try:
        return LLMServiceSpec.model_validate(dict(spec or {}))
    except ValidationError as err:
        raise SpecError(format_validation_error(err, "spec")) from None


ConditionType = Literal["Ready", "Progressing", "Degraded"]


class Condition(CamelModel):
    type: ConditionType = Field(description="Ready, Progressing or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word: why the condition has this status.")
    message: str = Field("", description="What happened, for a person.")
    last_transition_time: str = Field(
        alias="lastTransitionTime",
        json_schema_extra={"format": "date-time"},
        description="When status last changed.",
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="metadata.generation this was computed for."
    )


class ModelStatus(CamelModel):
    """One model of `platform.models`: its Serve application as KubeRay last reported it."""

    name: str = Field(description="The model's name (clients pass it as `model`).")
    app: str = Field(description="Its Serve application (`vllm-NAME`).")
    status: str | None = Field(
        None,
        description="Serve's application status (NOT_STARTED, DEPLOYING, RUNNING, UNHEALTHY, "
        "DEPLOY_FAILED, DELETING); unset while KubeRay reports none.",
    )
    ready: bool = Field(description="True when the application is RUNNING.")
    message: str | None = Field(None, description="Serve's message about the application.")


class LLMServiceStatus(CamelModel):
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing, Degraded."
    )
    model: str | None = Field(
        None,
        description="The model name clients pass as `model` (with `models`: every model's "
        "name, comma-separated).",
    )
    models: list[ModelStatus] | None = Field(
        None, description="With `platform.models`: each model's Serve application and readiness."
    )
    models_ready: str | None = Field(
        None, alias="modelsReady", description="With `platform.models`: models RUNNING / models."
    )
    observed_replicas: int | None = Field(
        None,
        alias="observedReplicas",
        description="Healthy vLLM replicas (Serve's count), as last measured: Ray exports the "
        "gauge only in some scrapes, so a scrape without it keeps this value.",
    )
    replicas_observed_at: str | None = Field(
        None,
        alias="replicasObservedAt",
        json_schema_extra={"format": "date-time"},
        description="When Serve's gauge first reported the current observedReplicas.",
    )
    queue_depth: float | None = Field(
        None, alias="queueDepth", description="Requests queued or running across vLLM replicas."
    )
    cold_models: list[str] | None = Field(
        None,
        alias="coldModels",
        description="Models scaled to zero (no replica running): their next request is held "
        "while a replica starts (a cold start).",
    )
    endpoint: str | None = Field(None, description="In-cluster base URL of the OpenAI routes.")
    ray_service: str | None = Field(
        None, alias="rayService", description="Name of the owned RayService."
    )
    observed_generation: int | None = Field(
        None, alias="observedGeneration", description="metadata.generation last acted on."
    )

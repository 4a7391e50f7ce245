"""Settings of one engine deployment's replicas: resources, the vLLM engine, autoscaling on queue
depth and backpressure (part of PlatformConfig, `serving/config/platform.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Accelerator = Literal["cpu", "gpu"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ReplicaResources(StrictModel):
    accelerator: Accelerator = Field(
        "cpu", description="'gpu' pins each replica to one GPU (num_gpus=1); 'cpu' uses CPU only."
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical Ray CPUs reserved per replica.")
    custom_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica requires (its actor's `resources`), so "
        "only nodes that advertise them run it. In a cluster replicas on the CPU also require "
        "llm-serving.io/cpu-worker, which only the chart's CPU worker group advertises.",
    )


class VLLMEngineConfig(StrictModel):
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of accelerator memory for weights + KV cache. On CPU it sizes the KV "
        "cache in host memory. Default: 0.90 on GPU, 0.25 on CPU.",
    )
    kv_cache_memory_gb: float | None = Field(
        None,
        gt=0,
        description="Explicit KV-cache size in GiB; overrides gpu_memory_utilization for the cache "
        "(useful on CPU, where the share is taken of the whole host's memory).",
    )
    enforce_eager: bool = Field(
        True, description="Skip graph capture/compilation: much faster start, slower decode."
    )
    max_num_seqs: int = Field(64, gt=0, description="Most sequences vLLM schedules in one step.")
    max_num_batched_tokens: int | None = Field(
        None, gt=0, description="Token budget of one scheduler step; vLLM's default when unset."
    )
    seed: int = Field(0, description="Engine seed for reproducible sampling.")
    engine_core: Literal["process", "inprocess"] = Field(
        "process",
        description="Where vLLM's engine core runs. process: AsyncLLM's child process, so "
        "scheduling and output handling overlap the forward pass. inprocess: inside the replica, "
        "driven by one thread; no second torch + vLLM import, so a new replica serves sooner "
        "(faster scale-up), at some decode throughput.",
    )
    standby_worker_s: int = Field(
        86400,
        ge=0,
        description="Each replica leaves one idle Ray worker on its node that has already "
        "imported torch and vLLM, kept this long, so the next replica there (a scale-up, a start "
        "from zero, a replacement) skips those imports. It holds the imported modules' memory "
        "while idle. 0: none, every replica imports them when it starts.",
    )
    sleep_when_idle_s: float | None = Field(
        None,
        gt=0,
        description="GPU only, a warm zero: a replica idle this long puts vLLM to sleep (level 1: "
        "weights moved to CPU memory, KV cache freed) and wakes it on the next request, in "
        "about the time the weights take to copy back, not a cold start. Starts vLLM with "
        "enable_sleep_mode. Not on the CPU, where vLLM has no sleep mode. Unset: never sleeps.",
    )
    cpu_threads: int | None = Field(
        None,
        gt=0,
        description="OpenMP threads of vLLM's CPU engine (OMP_NUM_THREADS); default: torch's "
        "own, one per core the replica may run on.",
    )
    cpu_niceness: int | None = Field(
        19,
        ge=0,
        le=19,
        description="On CPU, the niceness of the engine once it serves (its engine-core process, "
        "or the whole replica with engine_core inprocess; Ray starts workers at 15): a starting "
        "replica, Serve's proxy and controller get the cores before decode. None: unchanged.",
    )

    @model_validator(mode="after")
    def _check_sleep(self) -> VLLMEngineConfig:
        if self.sleep_when_idle_s is not None and self.engine_core == "inprocess":
            raise ValueError(
                "sleep_when_idle_s needs engine_core: process (the in-process engine core "
                "has no sleep mode)"
            )
        return self

    def check_device(self, accelerator: Accelerator) -> None:
        """Settings that only one kind of device supports."""
        if self.sleep_when_idle_s is not None and accelerator != "gpu":
            raise ValueError(
                "engine.sleep_when_idle_s: vLLM's sleep mode needs a GPU (CUDA or ROCm), but "
                "resources.accelerator is cpu; unset sleep_when_idle_s, or run on a GPU"
            )

    def memory_utilization(self, accelerator: Accelerator) -> float:
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return 0.90 if accelerator == "gpu" else 0.25


class AutoscalingSettings(StrictModel):
    """Serve autoscaling on queue depth: ongoing requests per replica (running in the engine +
    waiting in the engine + queued in the replica), reported by every replica to Serve."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas (0 allows scale to zero).")
    max_replicas: int = Field(1, ge=1, description="Most replicas (on GPU: most GPUs used).")
    target_queue_depth: float = Field(
        32.0, gt=0, description="Ongoing requests per replica the autoscaler aims for."
    )
    upscale_delay_s: float = Field(
        2.0,
        ge=0,
        description="Load must stay above target this long before scaling up; not from zero, "
        "where the first held request starts a replica at once.",
    )
    downscale_delay_s: float = Field(
        20.0, ge=0, description="Load must stay below target this long before scaling down."
    )
    downscale_to_zero_delay_s: float | None = Field(
        None,
        ge=0,
        description="How long the last replica must stay idle before it stops (Serve's "
        "downscale_to_zero_delay_s; read only with min_replicas 0), e.g. longer than "
        "downscale_delay_s so a short pause does not cost a cold start. Unset: "
        "downscale_delay_s (Serve's default).",
    )
    metrics_interval_s: float = Field(
        1.0, gt=0, description="How often each replica reports its queue to the autoscaler."
    )
    look_back_period_s: float = Field(
        3.0, gt=0, description="Window the autoscaler averages the queue over."
    )
    initial_replicas: int | None = Field(
        None,
        ge=0,
        description="Replicas a new deployment starts with, a new RayCluster's included (the "
        "LLMService operator sets the live count when a change builds one). Serve also resets a "
        "running deployment to it on every change of its options, so leave it unset otherwise; "
        "unset: min_replicas, or 1 when min_replicas is 0.",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError("initial_replicas must lie between min_replicas and max_replicas")
        return self

    def start_replicas(self) -> int | None:
        """Serve's `initial_replicas`. Serve resets a deployment to it whenever the deployment's
        options change (autoscaling_state.register), so a default one would drop a 4-replica
        deployment to 1 on an in-place change: it is written only when set, or to start a
        scale-to-zero deployment with one replica (which such a change then resets to 1)."""
        if self.initial_replicas is not None:
            return self.initial_replicas
        return 1 if self.min_replicas == 0 else None

    def _to_zero_option(self) -> dict[str, float]:
        """Written only when set, so every other deployment's serve config stays as it was."""
        delay = self.downscale_to_zero_delay_s
        return {} if delay is None else {"downscale_to_zero_delay_s": delay}

    def serve_options(self) -> dict[str, Any]:
        """Ray Serve's `autoscaling_config`."""
        initial = self.start_replicas()
        return {
            "min_replicas": self.min_replicas,
            **({"initial_replicas": initial} if initial is not None else {}),
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_queue_depth,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            **self._to_zero_option(),
            "look_back_period_s": self.look_back_period_s,
            # Deprecated in Ray 2.60 in favour of the push-interval variables of `ray_env`, but
            # 2.60's handles and replicas still push at this interval (10 s when unset), and only
            # here can a deployment set it.
            "metrics_interval_s": self.metrics_interval_s,
        }


class BackpressureSettings(StrictModel):
    """What happens when every replica is busy: a bounded queue, then a fast refusal."""

    max_queued_requests: int = Field(
        512, ge=-1, description="Requests waiting for a free replica slot; -1 = unbounded."
    )
    status_code: Literal[503, 429] = Field(503, description="Status of a refused request.")
    retry_after_s: float = Field(1.0, ge=0, description="The Retry-After header of a refusal.")
    max_queue_wait_s: float | None = Field(
        300.0,
        gt=0,
        description="Longest a request waits for a replica slot, e.g. while a deployment at zero "
        "starts its first replica (a cold start: minutes on a GPU node that must be added), "
        "then a refusal with status_code and Retry-After. Held by the model router (`models`); "
        "Serve's proxy, which holds a single-model app's requests at zero, has no such limit "
        "(only max_queued_requests bounds it there). None: no limit.",
    )

    def serve_options(self) -> dict[str, Any]:
        from ray.serve.config import BackpressureConfig

        return {
            "max_queued_requests": self.max_queued_requests,
            "backpressure_config": BackpressureConfig(
                status_code=self.status_code, retry_after_s=self.retry_after_s
            ),
        }


class ReplicaScaling(StrictModel):
    """Replica count, concurrency and backpressure of one engine deployment."""

    num_replicas: int = Field(1, ge=1, description="Replicas when autoscaling is off.")
    max_ongoing_requests: int = Field(
        256, gt=0, description="Requests one replica accepts at once."
    )
    autoscaling: AutoscalingSettings | None = Field(
        None, description="Scale replicas on queue depth; unset = a fixed num_replicas."
    )
    backpressure: BackpressureSettings = Field(
        default_factory=BackpressureSettings, description="Bounded queue in front of replicas."
    )
    resources: ReplicaResources = Field(
        default_factory=ReplicaResources, description="Resources of each replica."
    )
    graceful_shutdown_timeout_s: float | None = Field(
        None,
        ge=0,
        description="A replica stopped by a scale-down, a redeploy or a node drain first "
        "finishes its in-flight requests (open streams) for up to this long. Unset: the drain "
        "deadline (limits.request_timeout_s + 30 s), so a request within its limit is never cut; "
        "Serve's default is 20 s.",
    )
    graceful_shutdown_wait_loop_s: float = Field(
        1.0, gt=0, description="How often a stopping replica checks whether its requests ended."
    )
    max_surge_percent: int = Field(
        25,
        ge=0,
        le=100,
        description="Extra replicas a rolling restart (a new engine setting or model) may start, "
        "in percent of the target count, rounded up to whole replicas: replacements load before "
        "old replicas stop, so one replica is never zero. Needs that spare capacity (a GPU each); "
        "without it old replicas keep serving while replacements wait. 0: stop first (Serve's "
        "default).",
    )

    def replica_options(self, drain_deadline_s: float) -> dict[str, Any]:
        """Serve deployment options for replica count, concurrency, backpressure and drain;
        `drain_deadline_s` (serving.config.ray_env.drain_deadline_s) when no grace period is set."""
        grace_s = self.graceful_shutdown_timeout_s
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": drain_deadline_s if grace_s is None else grace_s,
            "graceful_shutdown_wait_loop_s": self.graceful_shutdown_wait_loop_s,
            "max_surge_percent": self.max_surge_percent,
        }
        if self.autoscaling is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = self.autoscaling.serve_options()
        return options | self.backpressure.serve_options()

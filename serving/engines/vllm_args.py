"""The options of a vLLM replica, as `vllm serve` takes them, parsed and validated by vLLM itself.

The platform's typed engine fields (`vllm.engine`) and the free `vllm.args` block become one
mapping of `vllm serve` options; vLLM's own argument parser (`make_arg_parser`, reading the mapping
the way it reads `vllm serve --config FILE.yaml`) turns it into the Namespace its OpenAI app and
engine are built from. So every option of the installed vLLM works, with vLLM's own checks and
messages, and the plain-vLLM peer of the benchmarks gets the very same options."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from serving.config import ConfigError, PlatformConfig

# Options the platform decides: one engine on one device per replica, the model it resolved.
PLATFORM_OWNED = ("model", "distributed_executor_backend", "tensor_parallel_size", "host", "port")


class ServerArgsError(ConfigError):
    """vLLM refused the options; the message is vLLM's, naming the option."""


def option_key(name: str) -> str:
    """`enable-auto-tool-choice` and `enable_auto_tool_choice` are the same vLLM option."""
    return name.lstrip("-").replace("-", "_")


def typed_options(config: PlatformConfig, preload_adapters: bool = True) -> dict[str, Any]:
    """The `vllm serve` options of the platform's typed fields (None: vLLM's default)."""
    engine = config.vllm.engine
    accelerator = config.vllm.resources.accelerator
    return {
        "served_model_name": [config.model.name],
        "dtype": config.model.dtype,
        "max_model_len": config.model.max_model_len,
        "gpu_memory_utilization": engine.memory_utilization(accelerator),
        "enforce_eager": engine.enforce_eager,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "kv_cache_memory_bytes": _gib_to_bytes(engine.kv_cache_memory_gb),
        "seed": engine.seed,
        "enable_sleep_mode": True if engine.sleep_when_idle_s is not None else None,
        # Batch lines ask for a lower priority than online requests (serving/state/batches.py);
        # vLLM refuses a request's priority under its default first-come-first-served policy.
        "scheduling_policy": "priority" if config.state.batch.enabled else None,
        # vLLM's engine span of each request, a child of the replica's (serving/tracing).
        "otlp_traces_endpoint": config.tracing.otlp_endpoint if config.tracing.enabled else None,
        **lora_options(config, preload_adapters),
    }


def lora_options(config: PlatformConfig, preload: bool = True) -> dict[str, Any]:
    """vLLM's LoRA options for the model's adapters (none when it has none): loaded at start
    (`lora_modules`), or, behind the model router, when a request names one (vllm_lora.py)."""
    adapters = config.vllm.adapters
    if not adapters and not config.vllm.runtime_adapters:
        return {}
    options: dict[str, Any] = {
        "enable_lora": True,
        "max_loras": config.vllm.max_adapters,
        "max_cpu_loras": config.vllm.max_adapters,
    }
    if preload:
        options["lora_modules"] = [json.dumps({"name": a.name, "path": a.path}) for a in adapters]
    return options


def server_options(
    config: PlatformConfig, model_dir: Path | str, preload_adapters: bool = True
) -> dict[str, Any]:
    """Every `vllm serve` option of the replica: the typed fields, then `vllm.args`. An option
    set in both places, or one the platform owns, is a config error naming it."""
    typed = {k: v for k, v in typed_options(config, preload_adapters).items() if v is not None}
    extra = {option_key(k): v for k, v in config.vllm.args.items()}
    for key in extra:
        if key in PLATFORM_OWNED:
            raise ConfigError(f"vllm.args.{key}: set by the platform, not an option here")
        if key in typed:
            raise ConfigError(f"vllm.args.{key}: already set by a typed field; set it there")
    if config.limits.max_tokens is not None:
        # vLLM's default max_tokens for a request that sets none (else the rest of the context).
        overrides = dict(extra.get("override_generation_config") or {})
        cap = min(
            overrides.get("max_new_tokens", config.limits.max_tokens), config.limits.max_tokens
        )
        extra["override_generation_config"] = {**overrides, "max_new_tokens": cap}
    return {
        "model": str(model_dir),
        **typed,
        **extra,
        # One replica = one engine on one device: the model runs inside the engine-core process,
        # never as Ray actors nested in the Serve replica (on CPU see vllm_env).
        "distributed_executor_backend": "uni",
        "tensor_parallel_size": 1,
    }


class _RaisingParser:
    """vLLM's parser, with argparse's print-usage-and-exit turned into an exception."""

    @staticmethod
    def build() -> Any:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        class Parser(FlexibleArgumentParser):
            def error(self, message: str):  # argparse would print usage and exit(2)
                raise ServerArgsError(message)

        return make_arg_parser(Parser(prog="vllm serve"))


def parse_server_options(options: dict[str, Any]) -> argparse.Namespace:
    """vLLM's Namespace for `options`, as `vllm serve --config options.yaml` would parse them,
    checked with vLLM's own serve-args validation."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args

    parser = _RaisingParser.build()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        # Flag spelling: vLLM's file reader turns `key: false` into `--no-key` only for it.
        yaml.safe_dump({key.replace("_", "-"): value for key, value in options.items()}, file)
        file.flush()
        try:
            args = parser.parse_args(["--config", file.name])
            validate_parsed_serve_args(args)
            validate_api_server_args(args)  # tool and reasoning parser names
        except ServerArgsError:
            raise
        except (TypeError, ValueError, KeyError) as err:
            message = err.args[0] if err.args else str(err)
            raise ServerArgsError(str(message).removeprefix("Error: ")) from None
    return args


def server_namespace(
    config: PlatformConfig, model_dir: Path | str, preload_adapters: bool = True
) -> argparse.Namespace:
    try:
        return parse_server_options(server_options(config, model_dir, preload_adapters))
    except ServerArgsError as err:
        raise ServerArgsError(f"vllm.args: vLLM refused the options: {err}") from None


def check_server_args(config: PlatformConfig) -> None:
    """Fail before anything starts when vLLM would refuse the options (`llm-serving up`) of the
    model, or of any entry of `models` (the message names the entry)."""
    if not config.models:
        server_namespace(config, "model-resolved-at-start")
    for index, entry in enumerate(config.models):
        try:
            server_namespace(config.model_platform(entry), "model-resolved-at-start")
        except ServerArgsError as err:
            raise ServerArgsError(f"models[{index}] ({entry.name}): {err}") from None


def engine_options(config: PlatformConfig, model_dir: Path | str) -> dict[str, Any]:
    """The engine's share of `server_options` (the keyword arguments of vLLM's `LLM` class)."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    names = {field.name for field in fields(EngineArgs)}
    return {k: v for k, v in server_options(config, model_dir).items() if k in names}


def async_engine_args(args: argparse.Namespace) -> Any:
    """vLLM's `AsyncEngineArgs` from the parsed options (what `vllm serve` builds its engine from)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(args)


def _gib_to_bytes(gib: float | None) -> int | None:
    return None if gib is None else int(gib * 1024**3)

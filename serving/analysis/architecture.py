"""Architecture of a causal LM from its config or a loaded model: summary, parameter counts, module
tree, attention shapes (GQA). Works on the meta device, so no weights are needed."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from serving.analysis import AnalysisInputError
from serving.analysis.kv_cache import kv_bytes_per_token


def load_model_config(path: str | Path) -> PretrainedConfig:
    """A config.json file (or a model directory holding one) as a transformers config."""
    source = Path(path).expanduser()
    if not source.exists():
        raise AnalysisInputError(f"config file {path} does not exist", param="config")
    try:
        return AutoConfig.from_pretrained(str(source))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AnalysisInputError(
            f"cannot read model config {path}: {first}", param="config"
        ) from None


def meta_model(config: PretrainedConfig) -> PreTrainedModel:
    """The model built on the meta device: real shapes and counts, no memory, no weights."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


SHIPPED_SUFFIX = "-config.json"
# The projections of an attention block this analysis reads, each an nn.Linear.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def shipped_configs() -> dict[str, Path]:
    """Architectures shipped as bare config.json files in serving/data: name -> file."""
    data = resources.files("serving").joinpath("data")
    return {
        entry.name.removesuffix(SHIPPED_SUFFIX): Path(str(entry))
        for entry in sorted(data.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(SHIPPED_SUFFIX)
    }


@cache
def shipped_model(name: str) -> PreTrainedModel:
    """The meta-device model of a shipped config (`--config-only` over HTTP, where a client must
    not name server paths); cached: building one takes a second, its report never changes."""
    configs = shipped_configs()
    if name not in configs:
        raise AnalysisInputError(
            f"unknown architecture '{name}'; allowed: {', '.join(configs) or 'none'}", param="arch"
        )
    return meta_model(load_model_config(configs[name]))


@cache
def shipped_report(name: str) -> dict[str, Any]:
    return config_report(shipped_model(name))


def dtype_name(dtype: Any) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'; float32 when the config names none."""
    if dtype is None:
        return "float32"
    return str(dtype).removeprefix("torch.")


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    # Multimodal configs nest the decoder's fields; text-only ones return themselves.
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def head_dim(config: PretrainedConfig) -> int:
    config = text_config(config)
    explicit = getattr(config, "head_dim", None)
    return int(explicit) if explicit else config.hidden_size // config.num_attention_heads


def kv_heads(config: PretrainedConfig) -> int:
    config = text_config(config)
    return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def rope_theta(config: PretrainedConfig) -> float | None:
    # transformers 5 moved rope_theta into rope_parameters; older configs keep it at the top.
    config = text_config(config)
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else None


def architecture_summary(config: PretrainedConfig) -> dict[str, Any]:
    text = text_config(config)
    heads, groups = text.num_attention_heads, kv_heads(config)
    return {
        "model_type": config.model_type,
        "architectures": list(getattr(config, "architectures", None) or []),
        "hidden_size": text.hidden_size,
        "num_layers": text.num_hidden_layers,
        "num_query_heads": heads,
        "num_kv_heads": groups,
        "head_dim": head_dim(config),
        "gqa_group_size": heads // groups,
        "intermediate_size": getattr(text, "intermediate_size", None),
        "vocab_size": text.vocab_size,
        "max_position_embeddings": getattr(text, "max_position_embeddings", None),
        "rope_theta": rope_theta(config),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "dtype": dtype_name(getattr(config, "dtype", None)),
    }


def decoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The stack of decoder blocks: the ModuleList with one entry per hidden layer."""
    count = text_config(model.config).num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    raise AnalysisInputError(f"{type(model).__name__}: no list of {count} decoder layers found")


def count_parameters(module: nn.Module) -> int:
    # parameters() yields a tied tensor once, so tied embeddings are not counted twice.
    return sum(p.numel() for p in module.parameters())


def parameter_counts(model: PreTrainedModel) -> dict[str, Any]:
    """Total, embeddings, the LM head (0 when tied to the embeddings), each decoder layer, the rest."""
    embed = model.get_input_embeddings().weight
    assert isinstance(embed, torch.Tensor), "an input embedding's weight is a Parameter"
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    head_params = 0 if head is None or tied else count_parameters(head)
    per_layer = [count_parameters(layer) for layer in decoder_layers(model)]
    total = count_parameters(model)
    return {
        "total": total,
        "embedding": embed.numel(),
        "lm_head": head_params,
        "lm_head_tied": tied,
        "layers_total": sum(per_layer),
        "per_layer": per_layer,
        "other": total - embed.numel() - head_params - sum(per_layer),
    }


def config_report(model: PreTrainedModel) -> dict[str, Any]:
    """Everything GET /analysis/config returns: summary, counts, KV bytes/token, the full config."""
    summary = architecture_summary(model.config)
    per_token = kv_bytes_per_token(
        summary["num_layers"], summary["num_kv_heads"], summary["head_dim"], summary["dtype"]
    )
    return {
        "architecture": summary,
        "parameters": parameter_counts(model),
        "kv_cache_bytes_per_token": per_token,
        "config": json.loads(model.config.to_json_string(use_diff=False)),
    }


def module_tree(model: nn.Module, max_depth: int | None = None) -> list[dict[str, Any]]:
    """One row per module in definition order: dotted name, depth, type, parameter count (with
    children) and the shapes of the module's own weights ([out, in] for Linear)."""
    rows = []
    for name, module in model.named_modules():
        depth = name.count(".") + 1 if name else 0
        if max_depth is not None and depth > max_depth:
            continue
        own = {pname: list(p.shape) for pname, p in module.named_parameters(recurse=False)}
        rows.append(
            {
                "name": name or "(root)",
                "depth": depth,
                "type": type(module).__name__,
                "parameters": count_parameters(module),
                "weights": own,
            }
        )
    return rows


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """Self-attention blocks with separate q/k/v/o projections (Llama, Qwen2, Mistral, ...)."""
    found = [
        m
        for m in model.modules()
        if all(isinstance(getattr(m, p, None), nn.Linear) for p in PROJECTIONS)
    ]
    if not found:
        raise AnalysisInputError(
            f"{type(model).__name__}: no attention with separate q/k/v/o projections to analyse"
        )
    return found


def projection(module: nn.Module, name: str) -> nn.Linear:
    linear = getattr(module, name)
    assert isinstance(linear, nn.Linear), f"attention_modules() keeps blocks whose {name} is Linear"
    return linear


def projection_shape(linear: nn.Linear) -> dict[str, Any]:
    return {"weight": list(linear.weight.shape), "bias": linear.bias is not None}


def attention_layer_shape(
    module: nn.Module, index: int, config: PretrainedConfig
) -> dict[str, Any]:
    dim = int(getattr(module, "head_dim", 0) or head_dim(config))
    linears = {name: projection(module, name) for name in PROJECTIONS}
    heads = linears["q_proj"].out_features // dim
    kv = linears["k_proj"].out_features // dim
    return {
        "layer": int(getattr(module, "layer_idx", index)),
        "type": type(module).__name__,
        **{name: projection_shape(linear) for name, linear in linears.items()},
        "num_query_heads": heads,
        "num_kv_heads": kv,
        "head_dim": dim,
        "kv_groups": heads // kv,
        "scaling": float(getattr(module, "scaling", dim**-0.5)),
        "causal": bool(getattr(module, "is_causal", True)),
        "sliding_window": getattr(module, "sliding_window", None),
    }


def attention_layers(model: PreTrainedModel) -> list[dict[str, Any]]:
    """Per layer: projection shapes, heads, KV groups (GQA), softmax scaling, causal flag."""
    return [
        attention_layer_shape(module, index, model.config)
        for index, module in enumerate(attention_modules(model))
    ]

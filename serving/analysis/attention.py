"""Attention weights of a prompt (eager attention returns them; SDPA/flash kernels do not) and
bertviz's interactive head view of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from serving.analysis import AnalysisInputError
from serving.analysis.page import inline_vendored_scripts

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_analysis_model(
    model_dir: str | Path, dtype: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (eager attention, eval mode) and tokenizer; dtype 'auto' keeps the checkpoint's."""
    torch_dtype = "auto" if dtype == "auto" else TORCH_DTYPES[dtype]
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), attn_implementation="eager", dtype=torch_dtype
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model.eval(), tokenizer


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str, max_tokens: int | None = None
) -> torch.Tensor:
    """Token ids [1, seq]; an empty prompt or one over `max_tokens` is refused with the limit."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise AnalysisInputError("prompt is empty", param="prompt")
    if max_tokens is not None and ids.shape[1] > max_tokens:
        raise AnalysisInputError(
            f"prompt has {ids.shape[1]} tokens; the limit is max_prompt_tokens={max_tokens}",
            param="prompt",
            code="prompt_too_long",
        )
    return ids


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor) -> list[str]:
    # Decode one id at a time: readable text (" capital") instead of BPE symbols ("Ġcapital").
    # One sequence of ids decodes to one string (a batch of them would give a list).
    return [cast(str, tokenizer.decode([int(i)])) for i in ids[0]]


def select_indices(requested: list[int] | None, count: int, name: str) -> list[int]:
    """All of 0..count-1 when None; otherwise the sorted, de-duplicated, range-checked request."""
    if requested is None:
        return list(range(count))
    if not requested:
        raise AnalysisInputError(f"{name}s must name at least one index", param=f"{name}s")
    bad = [i for i in requested if not 0 <= i < count]
    if bad:
        raise AnalysisInputError(
            f"unknown {name} index {bad[0]}; allowed: 0..{count - 1}", param=f"{name}s"
        )
    return sorted(set(requested))


def check_attention_size(layers: int, heads: int, seq: int, max_values: int | None) -> None:
    """Attention is layers x heads x seq^2 numbers; refuse answers larger than the limit."""
    values = layers * heads * seq * seq
    if max_values is not None and values > max_values:
        raise AnalysisInputError(
            f"{layers} layers x {heads} heads x {seq}^2 tokens = {values} attention values; the "
            f"limit is max_attention_values={max_values}: select fewer layers or heads, or a "
            "shorter prompt",
            param="layers",
            code="attention_too_large",
        )


@torch.inference_mode()
def attention_weights(
    model: PreTrainedModel, input_ids: torch.Tensor, layers: list[int]
) -> dict[int, torch.Tensor]:
    """Per selected layer the softmax weights [heads, seq, seq] (row = query, column = key)."""
    out = model(input_ids, output_attentions=True, use_cache=False, logits_to_keep=1)
    if not out.attentions or out.attentions[0] is None:
        raise AnalysisInputError("the model returned no attention weights (needs eager attention)")
    return {layer: out.attentions[layer][0].float() for layer in layers}


def attention_json(
    weights: dict[int, torch.Tensor], heads: list[int], decimals: int = 6
) -> list[dict[str, Any]]:
    """[{layer, heads: [{head, weights}]}]; rounded, which keeps long prompts' answers smaller."""
    return [
        {
            "layer": layer,
            "heads": [
                {"head": h, "weights": torch.round(tensor[h], decimals=decimals).tolist()}
                for h in heads
            ],
        }
        for layer, tensor in weights.items()
    ]


def head_view_html(
    weights: dict[int, torch.Tensor],
    tokens: list[str],
    num_layers: int,
    heads: list[int],
    title: str,
) -> str:
    """bertviz's head view as a standalone page: its fragment (the view's script, with require.js,
    d3 and jQuery inlined from serving/analysis/static) inside a minimal HTML document that a
    browser opens directly, with no network."""
    from bertviz import head_view

    # bertviz indexes the list by layer number, so unselected layers can stay empty.
    per_layer = [weights[i].unsqueeze(0) if i in weights else None for i in range(num_layers)]
    fragment = head_view(
        attention=per_layer,
        tokens=tokens,
        prettify_tokens=False,
        include_layers=list(weights),
        heads=heads,
        html_action="return",
    ).data
    fragment = inline_vendored_scripts(fragment)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{title}</title></head>\n<body>\n{fragment}\n</body></html>\n"
    )


def attention_report(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    fmt: str = "json",
    max_prompt_tokens: int | None = None,
    max_values: int | None = None,
) -> dict[str, Any] | str:
    """The prompt's tokens and attention weights (fmt 'json') or the bertviz page (fmt 'html')."""
    if fmt not in ("json", "html"):
        raise AnalysisInputError(f"unknown format '{fmt}'; allowed: json, html", param="format")
    ids = encode_prompt(tokenizer, prompt, max_prompt_tokens)
    num_layers, num_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    chosen_layers = select_indices(layers, num_layers, "layer")
    chosen_heads = select_indices(heads, num_heads, "head")
    shipped_heads = num_heads if fmt == "html" else len(chosen_heads)  # the page carries every head
    check_attention_size(len(chosen_layers), shipped_heads, ids.shape[1], max_values)
    weights = attention_weights(model, ids, chosen_layers)
    tokens = token_texts(tokenizer, ids)
    if fmt == "html":
        return head_view_html(weights, tokens, num_layers, chosen_heads, "attention head view")
    return {
        "tokens": tokens,
        "token_ids": ids[0].tolist(),
        "num_layers": num_layers,
        "num_heads": num_heads,
        "layers": chosen_layers,
        "heads": chosen_heads,
        "attention": attention_json(weights, chosen_heads),
    }

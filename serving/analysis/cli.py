"""`llm-serving analyze ...`: the analysis routes as offline commands on a model reference (or,
for the architecture commands, a bare config.json on the meta device). Tables for people, --json
for programs; bad input is one `error:` line and a non-zero exit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import click

from serving.analysis import AnalysisInputError
from serving.analysis.cli_common import (
    analysis_errors,
    architecture_model,
    config_only_option,
    dtype_option,
    json_option,
    model_option,
    parse_indices,
    weights_model,
)
from serving.analysis.cli_output import (
    echo_attention_matrices,
    echo_json,
    echo_rows,
    echo_table,
    num,
)


@click.group()
def analyze() -> None:
    """Open a model up: config, modules, GQA, KV cache, attention, per-token latency."""


@analyze.command("config")
@model_option
@config_only_option
@json_option
@analysis_errors
def config_cmd(model_ref: str, config_only: str | None, as_json: bool) -> None:
    """Architecture parameters and parameter counts."""
    from serving.analysis.architecture import config_report

    report = config_report(architecture_model(model_ref, config_only))
    if as_json:
        return echo_json(report)
    arch, params = report["architecture"], report["parameters"]
    per_layer = params["per_layer"]
    layers = (
        f"{num(per_layer[0])} x {len(per_layer)} = {num(params['layers_total'])}"
        if len(set(per_layer)) == 1
        else ", ".join(num(n) for n in per_layer)
    )
    echo_rows(
        [
            ("source", config_only or model_ref),
            ("architecture", f"{', '.join(arch['architectures']) or '-'} ({arch['model_type']})"),
            ("hidden size", num(arch["hidden_size"])),
            ("layers", num(arch["num_layers"])),
            ("query heads", num(arch["num_query_heads"])),
            (
                "KV heads",
                f"{arch['num_kv_heads']} (GQA: {arch['gqa_group_size']} query heads per KV head)",
            ),
            ("head dim", num(arch["head_dim"])),
            ("intermediate size", num(arch["intermediate_size"])),
            ("vocab size", num(arch["vocab_size"])),
            ("max positions", num(arch["max_position_embeddings"])),
            ("RoPE theta", num(arch["rope_theta"])),
            ("tied embeddings", "yes" if arch["tie_word_embeddings"] else "no"),
            ("dtype", arch["dtype"]),
            ("parameters", num(params["total"])),
            ("  embedding", num(params["embedding"])),
            (
                "  lm head",
                "tied to the embedding" if params["lm_head_tied"] else num(params["lm_head"]),
            ),
            ("  per layer", layers),
            ("  other", num(params["other"])),
            (
                "KV cache",
                f"{num(report['kv_cache_bytes_per_token'])} bytes/token ({arch['dtype']})",
            ),
        ]
    )


@analyze.command("modules")
@model_option
@config_only_option
@click.option("--depth", type=click.IntRange(min=0), help="Deepest module level to list.")
@json_option
@analysis_errors
def modules_cmd(model_ref: str, config_only: str | None, depth: int | None, as_json: bool) -> None:
    """The module tree with types, parameter counts and weight shapes."""
    from serving.analysis.architecture import module_tree

    rows = module_tree(architecture_model(model_ref, config_only), depth)
    if as_json:
        return echo_json(rows)
    table = []
    for row in rows:
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in row["weights"].items())
        leaf = row["name"].rsplit(".", 1)[-1]
        table.append(["  " * row["depth"] + leaf, row["type"], num(row["parameters"]), shapes])
    echo_table(["module", "type", "parameters", "weights"], table)


@analyze.command("attention-layers")
@model_option
@config_only_option
@json_option
@analysis_errors
def attention_layers_cmd(model_ref: str, config_only: str | None, as_json: bool) -> None:
    """Per layer: q/k/v/o shapes, KV groups (GQA), scaling, causal flag."""
    from serving.analysis.architecture import attention_layers

    layers = attention_layers(architecture_model(model_ref, config_only))
    if as_json:
        return echo_json(layers)

    def shape(proj: dict[str, Any]) -> str:
        return "x".join(map(str, proj["weight"])) + ("+b" if proj["bias"] else "")

    echo_table(
        [
            "layer",
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "heads",
            "kv",
            "groups",
            "head_dim",
            "scaling",
            "causal",
        ],
        [
            [
                str(x["layer"]),
                shape(x["q_proj"]),
                shape(x["k_proj"]),
                shape(x["v_proj"]),
                shape(x["o_proj"]),
                str(x["num_query_heads"]),
                str(x["num_kv_heads"]),
                str(x["kv_groups"]),
                str(x["head_dim"]),
                f"{x['scaling']:.6g}",
                "yes" if x["causal"] else "no",
            ]
            for x in layers
        ],
    )


@analyze.command("kv-cache")
@model_option
@config_only_option
@click.option(
    "--tokens", type=int, default=2048, show_default=True, help="Context length per sequence."
)
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences cached at once.")
@click.option("--dtype", default="auto", show_default=True, help="KV dtype; auto = the model's.")
@click.option("--memory-gb", type=float, default=1.0, show_default=True, help="Budget in GiB.")
@json_option
@analysis_errors
def kv_cache_cmd(
    model_ref: str,
    config_only: str | None,
    tokens: int,
    batch: int,
    dtype: str,
    memory_gb: float,
    as_json: bool,
) -> None:
    """KV-cache bytes per token, total, saving against full MHA, tokens fitting a budget."""
    from serving.analysis.architecture import architecture_summary
    from serving.analysis.kv_cache import kv_cache_report_for

    model = architecture_model(model_ref, config_only)
    report = kv_cache_report_for(
        architecture_summary(model.config), tokens, batch, dtype, memory_gb
    )
    if as_json:
        return echo_json(report)
    mha, saving, budget = report["mha"], report["saving"], report["budget"]
    echo_rows(
        [
            ("dtype", f"{report['dtype']} ({report['dtype_bytes']} bytes)"),
            ("bytes per token", f"{num(report['bytes_per_token'])} = {report['formula']}"),
            ("context x batch", f"{num(tokens)} tokens x {num(batch)}"),
            ("total", f"{num(report['total_bytes'])} bytes ({report['total_mib']:,.1f} MiB)"),
            (
                "full MHA would be",
                f"{num(mha['bytes_per_token'])} bytes/token, {num(mha['total_bytes'])} total",
            ),
            ("GQA saving", f"{saving['factor']:g}x, {num(saving['bytes'])} bytes"),
            (
                f"fits in {memory_gb:g} GiB",
                f"{num(budget['tokens_fit'])} tokens "
                f"({num(budget['sequences_fit'])} sequences of {num(tokens)}; MHA: {num(budget['tokens_fit_mha'])})",
            ),
        ]
    )


@analyze.command("attention")
@model_option
@click.option("--prompt", required=True, help="Text whose attention weights are shown.")
@click.option("--layers", help="Comma-separated layer indices (default: all).")
@click.option("--heads", help="Comma-separated head indices (default: all).")
@click.option(
    "--html", "html_path", type=click.Path(dir_okay=False), help="Write bertviz's head view here."
)
@dtype_option
@json_option
@analysis_errors
def attention_cmd(
    model_ref: str,
    prompt: str,
    layers: str | None,
    heads: str | None,
    html_path: str | None,
    dtype: str,
    as_json: bool,
) -> None:
    """Tokens and attention weights per layer and head (eager attention)."""
    from serving.analysis.attention import attention_report

    model, tokenizer = weights_model(model_ref, dtype)
    chosen_layers, chosen_heads = parse_indices(layers, "layers"), parse_indices(heads, "heads")
    if html_path:
        page = attention_report(model, tokenizer, prompt, chosen_layers, chosen_heads, "html")
        Path(html_path).write_text(cast(str, page), encoding="utf-8")  # the page declares utf-8
        click.echo(f"wrote {html_path}")
        return
    report = cast(
        dict[str, Any], attention_report(model, tokenizer, prompt, chosen_layers, chosen_heads)
    )
    if as_json:
        return echo_json(report)
    click.echo(f"tokens ({len(report['tokens'])}): {report['tokens']}")
    echo_attention_matrices(report)


@analyze.command("generation-trace")
@model_option
@click.option("--prompt", required=True, help="Prompt to decode greedily from.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option(
    "--mode", type=click.Choice(["no-cache", "kv-cache", "both"]), default="both", show_default=True
)
@dtype_option
@json_option
@analysis_errors
def generation_trace_cmd(
    model_ref: str, prompt: str, max_new_tokens: int, mode: str, dtype: str, as_json: bool
) -> None:
    """Per-token latency without and with the KV cache, and the fitted growth per token."""
    from serving.analysis.latency import MODES, generation_trace

    model, tokenizer = weights_model(model_ref, dtype)
    modes = MODES if mode == "both" else (mode,)
    traces = [generation_trace(model, tokenizer, prompt, max_new_tokens, m) for m in modes]
    if as_json:
        return echo_json(traces if mode == "both" else traces[0])
    echo_table(
        ["mode", "prompt", "new", "first ms", "mean decode ms", "total ms", "growth ms/token"],
        [
            [
                t["mode"],
                str(t["prompt_tokens"]),
                str(t["new_tokens"]),
                f"{t['first_token_ms']:.2f}",
                num(t["mean_decode_ms"]),
                f"{t['total_ms']:.1f}",
                num(t["growth"]["slope_ms_per_token"]),
            ]
            for t in traces
        ],
    )
    for t in traces:
        click.echo(
            f"{t['mode']} per-token ms: " + " ".join(f"{ms:.1f}" for ms in t["latencies_ms"])
        )


# The issue names the command `trace`; both spellings work.
analyze.add_command(generation_trace_cmd, name="trace")


def console_url(config_path: str | None) -> str:
    """The console's URL: from --config, else the running platform's, else the shipped default's."""
    from serving.config import load_config
    from serving.local import platform as local

    running = None if config_path else local.load_state()
    url = (
        running.analysis_url if running else local.endpoints(load_config(config_path)).analysis_url
    )
    if url is None:
        raise AnalysisInputError("the analysis app is off in this config (analysis.enabled: false)")
    return url


def open_in_browser(url: str) -> bool:
    """True when a browser took the URL; False where there is none (a server, a container)."""
    import webbrowser

    try:
        return webbrowser.open(url)
    except webbrowser.Error:
        return False


@analyze.command("open")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Platform config YAML (default: the running platform, else the shipped default).",
)
@click.option("--no-browser", is_flag=True, help="Print the URL only.")
@analysis_errors
def open_cmd(config_path: str | None, no_browser: bool) -> None:
    """The analysis console in a browser: prints its URL and opens it where a browser exists."""
    url = console_url(config_path)
    click.echo(url)
    if not no_browser and not open_in_browser(url):
        click.echo("no browser found here: open the URL above in one", err=True)

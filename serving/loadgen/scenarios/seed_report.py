"""The seed suite's report: result.json (every figure), summary.md (one table per experiment, the
study's own figures beside ours) and seed.png (one panel per experiment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from serving.loadgen.report import Report

# What the study saw on a GPU; ours are CPU figures, printed beside them, not compared to them.
STUDY = {
    "one_prompt": "17x on a GPU",
    "four_prompts": "~2 s one by one vs ~1.1 s batched (x1.8)",
}


def _x(value: float) -> str:
    return f"x{value:.2f}"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The headline of each experiment, one line each (console and the top of summary.md)."""
    a, b, c = doc["one_prompt"], doc["kv_cache"], doc["four_prompts"]
    e = doc["static_batch_waste"]
    biggest = {
        r["engine"]: r
        for r in doc["batch_efficiency"]
        if r["batch"] == max(row["batch"] for row in doc["batch_efficiency"])
    }
    return [
        f"a. one prompt, {a['new_tokens']} tokens: generate() {a['hf_generate_s']:.2f} s, "
        f"vLLM {a['vllm_s']:.2f} s -> vLLM {_x(a['speedup'])} (study: {STUDY['one_prompt']})",
        f"b. KV cache: decode step {b['no-cache']['mean_decode_ms']:.1f} ms without vs "
        f"{b['kv-cache']['mean_decode_ms']:.1f} ms with; growth "
        f"{b['no-cache']['growth']['slope_ms_per_token']:.3f} vs "
        f"{b['kv-cache']['growth']['slope_ms_per_token']:.3f} ms per token of context; "
        f"whole generation {_x(b['total_speedup'])} faster with it",
        f"c. 4 prompts: one by one {c['one_by_one_s']:.2f} s, batched {c['batched_s']:.2f} s -> "
        f"{_x(c['speedup'])}, not x4 (study: {STUDY['four_prompts']})",
        "d. largest batch ({}): per-sequence efficiency static {:.0%}, vLLM {:.0%}".format(
            biggest["hf"]["batch"], biggest["hf"]["efficiency"], biggest["vllm"]["efficiency"]
        ),
        f"e. static batch of 4 mixed requests: {e['padding_waste']:.0%} of prompt slots are padding, "
        f"{e['idle_waste']:.0%} of decode slots belong to finished rows; a batched step costs "
        f"{_x(e['batch_step_cost_ratio'])} a single one -> expected {_x(e['expected_speedup'])}, "
        f"measured {_x(e['measured_speedup'])}",
    ]


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Seed suite: {doc['model_id']} ({doc['dtype']})",
        "",
        *[f"- {line}" for line in summary_lines(doc)],
        "",
        "## d. Batch size efficiency",
        "",
        "| engine | batch | seconds | output tok/s | speedup vs batch 1 | efficiency |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["batch_efficiency"]:
        lines.append(
            f"| {r['engine']} | {r['batch']} | {r['seconds']:.2f} | "
            f"{r['output_tokens_per_s']:.1f} | {_x(r['speedup'])} | {r['efficiency']:.0%} |"
        )
    e = doc["static_batch_waste"]
    lines += [
        "",
        "## e. Static batching waste",
        "",
        f"Prompt tokens {e['prompt_tokens']}, output tokens {e['output_tokens']}. The batch is "
        "padded to its longest prompt and decodes until its longest output; each batched step "
        "also costs more than a single one, so 4 prompts are not 4x faster.",
        "",
        "Expected speedup = rows x useful decode fraction / batched step cost.",
        "",
    ]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    a = doc["one_prompt"]
    axes[0][0].bar(["generate()", "vLLM"], [a["hf_generate_s"], a["vllm_s"]], color=["C1", "C0"])
    axes[0][0].set_title(f"a. one prompt, {a['new_tokens']} tokens (s): vLLM {_x(a['speedup'])}")
    for mode, color in (("no-cache", "C3"), ("kv-cache", "C2")):
        axes[0][1].plot(doc["kv_cache"][mode]["latencies_ms"], color=color, label=mode)
    axes[0][1].set(title="b. latency of each new token (ms)", xlabel="token position")
    axes[0][1].legend()
    c, e = doc["four_prompts"], doc["static_batch_waste"]
    labels = [
        "4 same-length\none by one",
        "4 same-length\nbatched",
        "4 mixed\none by one",
        "4 mixed\nbatched",
    ]
    values = [c["one_by_one_s"], c["batched_s"], e["one_by_one_s"], e["batched_s"]]
    axes[1][0].bar(labels, values, color=["C1", "C0", "C1", "C0"])
    axes[1][0].set_title(
        f"c/e. batched vs one by one (s): x{c['speedup']:.2f} / x{e['measured_speedup']:.2f}"
    )
    for engine, color in (("hf", "C1"), ("vllm", "C0")):
        rows = [r for r in doc["batch_efficiency"] if r["engine"] == engine]
        axes[1][1].plot(
            [r["batch"] for r in rows],
            [r["efficiency"] for r in rows],
            "o-",
            color=color,
            label="generate() static" if engine == "hf" else "vLLM",
        )
    axes[1][1].set(title="d. per-sequence efficiency vs batch 1", xlabel="batch size", xscale="log")
    batches = sorted({r["batch"] for r in doc["batch_efficiency"]})
    axes[1][1].set_xticks(batches, [str(b) for b in batches])  # the batch sizes, not 10^n
    axes[1][1].xaxis.set_minor_formatter(NullFormatter())
    axes[1][1].legend()
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(doc: dict[str, Any]) -> Report:
    return Report("seed", doc, markdown(doc), summary_lines(doc), {"seed.png": plot})

"""`llm-serving vllm-bench`: vLLM's own benchmark client (`vllm.benchmarks.serve`, the client
`vllm bench serve` runs) against several targets, interleaved round by round, with the ratios of
each target to a baseline side by side. With `--peer vllm` it starts plain vLLM's server on the
same model and `vllm serve` options as the platform config (the wrapper-cost comparison)."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

METRICS = ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms")
BACKENDS = {
    "completions": ("openai", "/v1/completions"),
    "chat": ("openai-chat", "/v1/chat/completions"),
}


@dataclass(frozen=True)
class Shape:
    input_len: int
    output_len: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        try:
            prompt, output = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise click.BadParameter(f"shape {text!r}: want INPUTxOUTPUT, e.g. 16x128") from None
        return cls(prompt, output)

    def __str__(self) -> str:
        return f"{self.input_len}x{self.output_len}"


def client_args(
    origin: str,
    model: str,
    tokenizer: str,
    endpoint: str,
    shape: Shape,
    concurrency: int,
    num_prompts: int,
    seed: int,
) -> Any:
    """vLLM's bench-client namespace: random prompts of exact length, fixed output length."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    backend, path = BACKENDS[endpoint]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(
        [
            "--backend",
            backend,
            "--base-url",
            origin,
            "--endpoint",
            path,
            "--model",
            model,
            "--tokenizer",
            tokenizer,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(shape.input_len),
            "--random-output-len",
            str(shape.output_len),
            "--random-range-ratio",
            "0",
            "--ignore-eos",
            "--num-prompts",
            str(num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--seed",
            str(seed),
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,itl",
            "--ready-check-timeout-sec",
            "0",
        ]
    )


def run_client(args: Any) -> dict[str, Any]:
    """One run of vLLM's client (its own printout kept out of ours)."""
    from vllm.benchmarks.serve import main

    with contextlib.redirect_stdout(io.StringIO()):
        result = main(args)
    return {key: result.get(key) for key in (*METRICS, "completed", "failed")}


def ratios(runs: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, dict[str, float]]:
    """Median over rounds per target, and each target's throughput ratio to the baseline."""
    medians = {
        name: {m: statistics.median(r[m] for r in rounds) for m in METRICS}
        for name, rounds in runs.items()
    }
    base = medians[baseline]["output_throughput"]
    for name, values in medians.items():
        values["throughput_ratio"] = values["output_throughput"] / base if base else float("nan")
        values["failed"] = sum(r["failed"] for r in runs[name])
    return medians


def table(results: dict[str, dict[str, dict[str, float]]], baseline: str) -> str:
    lines = [
        "| shape | c | target | out tok/s | x " + baseline + " | TTFT p50 ms | ITL p50 ms "
        "| TPOT p50 ms | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, medians in results.items():
        shape, concurrency = cell.split("@")
        for name, v in medians.items():
            lines.append(
                f"| {shape} | {concurrency} | {name} | {v['output_throughput']:.1f} | "
                f"{v['throughput_ratio']:.3f} | {v['median_ttft_ms']:.0f} | "
                f"{v['median_itl_ms']:.1f} | {v['median_tpot_ms']:.1f} | {int(v['failed'])} |"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def targets_with_peer(
    targets: dict[str, str], peer: bool, config_path: str | None, model: str, output: Path
) -> Iterator[dict[str, str]]:
    if not peer:
        yield targets
        return
    from serving.config import load_config
    from serving.loadgen.peers import VLLM_PEER_NAME, vllm_peer

    config = load_config(config_path).platform_of(model)
    with vllm_peer(config, model, output / "vllm-peer.log") as target:
        yield {**targets, VLLM_PEER_NAME: target.origin}


@click.command("vllm-bench")
@click.option(
    "--target",
    "target_items",
    multiple=True,
    required=True,
    metavar="NAME=ORIGIN",
    help="A server origin, e.g. platform=http://127.0.0.1:8000 (repeatable).",
)
@click.option(
    "--peer-vllm",
    is_flag=True,
    help="Also start plain vLLM's server with --config's model and vllm serve options.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Platform config YAML (model, options) for --peer-vllm and the tokenizer.",
)
@click.option(
    "--baseline",
    default="vllm-serve",
    show_default=True,
    help="Target every throughput ratio is taken against.",
)
@click.option("--model", required=True, help="Model name to request.")
@click.option(
    "--endpoint", type=click.Choice(sorted(BACKENDS)), default="completions", show_default=True
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    default=("16x128", "128x64"),
    show_default=True,
    help="INPUTxOUTPUT tokens per request (repeatable).",
)
@click.option("--concurrency", default="8,16", show_default=True)
@click.option("--num-prompts", default=32, show_default=True, help="Requests per run.")
@click.option("--rounds", default=2, show_default=True, help="Interleaved rounds per cell.")
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    default="bench-results/vllm-bench",
    show_default=True,
)
def vllm_bench(
    target_items: tuple[str, ...],
    peer_vllm: bool,
    config_path: str | None,
    baseline: str,
    model: str,
    endpoint: str,
    shapes: tuple[str, ...],
    concurrency: str,
    num_prompts: int,
    rounds: int,
    output: str,
) -> None:
    """vLLM's benchmark client against each target, interleaved; ratios to --baseline."""
    from serving.config import load_config
    from serving.models import resolve_model

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(config_path).platform_of(model)
    tokenizer = str(resolve_model(config.model.ref, config.model.cache_dir))
    targets = dict(item.split("=", 1) for item in target_items)
    levels = [int(level) for level in concurrency.split(",")]
    results: dict[str, dict[str, dict[str, float]]] = {}
    with targets_with_peer(targets, peer_vllm, config_path, model, out) as all_targets:
        if baseline not in all_targets:
            raise click.BadParameter(f"--baseline {baseline} is not a target")
        for shape in map(Shape.parse, shapes):
            for level in levels:
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in all_targets}
                for round_index in range(rounds):
                    for name, origin in all_targets.items():
                        args = client_args(
                            origin,
                            model,
                            tokenizer,
                            endpoint,
                            shape,
                            level,
                            num_prompts,
                            seed=round_index,
                        )
                        runs[name].append(run_client(args))
                results[f"{shape}@{level}"] = ratios(runs, baseline)
                click.echo(table({f"{shape}@{level}": results[f"{shape}@{level}"]}, baseline))
    (out / "result.json").write_text(json.dumps(results, indent=2))
    (out / "summary.md").write_text(table(results, baseline) + "\n")
    click.echo(table(results, baseline))

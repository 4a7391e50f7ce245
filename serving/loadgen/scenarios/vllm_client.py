"""`llm-serving bench vllm-client`: vLLM's own benchmark client (`vllm.benchmarks.serve`, the client
`vllm bench serve` runs) against several targets, interleaved round by round, with the ratios of
each target to a baseline side by side. With `--peer vllm` it starts plain vLLM's server on the
same model and `vllm serve` options as the platform config (the wrapper-cost comparison)."""

from __future__ import annotations

import contextlib
import io
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from serving.loadgen.args import UsageError, parse_list
from serving.loadgen.peers import VLLM_PEER_NAME
from serving.loadgen.report import Report

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
            raise UsageError(f"--shape {text!r}: want INPUTxOUTPUT, e.g. 16x128") from None
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
    from serving.loadgen.peers import vllm_peer

    config = load_config(config_path).platform_of(model)
    with vllm_peer(config, model, output / "vllm-peer.log") as target:
        yield {**targets, VLLM_PEER_NAME: target.origin}


@dataclass(frozen=True)
class VLLMClientArgs:
    """`bench vllm-client`: the options as given."""

    target_items: tuple[str, ...]
    peer: str | None
    config_path: str | None
    baseline: str
    model: str
    endpoint: str
    shapes: tuple[str, ...]
    concurrency: str
    num_prompts: int
    rounds: int


def parse_origins(items: tuple[str, ...]) -> dict[str, str]:
    origins = dict(item.partition("=")[::2] for item in items)
    bad = [o for o in origins.values() if not o.startswith(("http://", "https://"))]
    if bad or len(origins) != len(items):
        raise UsageError(f"--target: expected distinct NAME=http://HOST:PORT, got {list(items)}")
    return origins


def run_vllm_client(args: VLLMClientArgs, out: Path) -> Report:
    """vLLM's client against every target, interleaved round by round in each cell."""
    from serving.config import load_config
    from serving.models import resolve_model

    shapes = [Shape.parse(text) for text in args.shapes]
    levels = parse_list(args.concurrency, int, "--concurrency")
    targets = parse_origins(args.target_items)
    names = [*targets, *([VLLM_PEER_NAME] if args.peer == "vllm" else [])]
    if args.baseline not in names:
        raise UsageError(f"--baseline {args.baseline}: not a target ({', '.join(names)})")
    config = load_config(args.config_path).platform_of(args.model)
    tokenizer = str(resolve_model(config.model.ref, config.model.cache_dir))
    results: dict[str, dict[str, dict[str, float]]] = {}
    out.mkdir(parents=True, exist_ok=True)  # the peer's log
    with targets_with_peer(
        targets, args.peer == "vllm", args.config_path, args.model, out
    ) as every:
        for shape in shapes:
            for level in levels:
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in every}
                for round_index in range(args.rounds):
                    for name, origin in every.items():
                        cli = client_args(
                            origin,
                            args.model,
                            tokenizer,
                            args.endpoint,
                            shape,
                            level,
                            args.num_prompts,
                            seed=round_index,
                        )
                        runs[name].append(run_client(cli))
                results[f"{shape}@{level}"] = ratios(runs, args.baseline)
                cell = {f"{shape}@{level}": results[f"{shape}@{level}"]}
                click.echo(table(cell, args.baseline), err=True)  # progress; the report at the end
    summary = table(results, args.baseline)
    return Report(
        "vllm-client", {"baseline": args.baseline, "cells": results}, summary + "\n", [summary]
    )

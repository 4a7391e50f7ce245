"""`llm-serving bench seed`: the experiments of the study this project grew out of, measured
on one machine in one run, in-process (library calls, no servers, as the study ran them):

a. one prompt through transformers `generate()` vs the vLLM engine (equal new tokens);
b. per-token latency by position without vs with the KV cache;
c. 4 prompts in one padded `generate()` batch vs one by one;
d. batch 4 vs 32 vs 64: throughput and per-sequence efficiency, static (`generate()`) and vLLM;
e. where static batching wastes work: padded prompt slots and finished rows that keep decoding,
   counted from the real batch, beside the cost of one batched step vs one single step.

Every generation ignores EOS so engines do equal work; each timing is the median of `repeats` runs
after one warm-up."""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from serving.config import PlatformConfig
from serving.loadgen.args import parse_list
from serving.loadgen.report import Report
from serving.loadgen.workloads import SEED_PROMPTS

# (e)'s batch: prompts of different lengths asking for different numbers of tokens, as real traffic.
MIXED_OUTPUT_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class SuiteArgs:
    new_tokens: int = 32
    batch_sizes: tuple[int, ...] = (4, 32, 64)
    repeats: int = 3


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall time of `run` over `repeats` calls, after one untimed warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def batch_prompts(size: int) -> list[str]:
    """`size` prompts cycling through the seed's questions."""
    return [SEED_PROMPTS[i % len(SEED_PROMPTS)] for i in range(size)]


def padding_slots(lengths: list[int]) -> tuple[int, int]:
    """(pad slots, all slots) of a prompt batch left-padded to its longest prompt."""
    longest = max(lengths)
    return sum(longest - n for n in lengths), longest * len(lengths)


def idle_slots(output_lengths: list[int]) -> tuple[int, int]:
    """(slots decoded after a row was done, all decode slots) when the batch runs to its longest."""
    longest = max(output_lengths)
    return sum(longest - n for n in output_lengths), longest * len(output_lengths)


def expected_speedup(rows: int, useful_fraction: float, step_cost_ratio: float) -> float:
    """One-by-one time / batch time if batching only lost the wasted slots and the dearer step:
    `rows` sequences per step, of which `useful_fraction` of the work counts, each step costing
    `step_cost_ratio` times a single-sequence step."""
    return rows * useful_fraction / step_cost_ratio


class Generates(Protocol):
    """The part of a causal LM HFRunner calls. transformers types generate()'s self as its own
    GenerativePreTrainedModel protocol, which mypy finds its model classes do not satisfy."""

    def generate(self, *args: Any, **kwargs: Any) -> Any: ...


class HFRunner:
    """transformers `generate()` on the model, greedy, EOS ignored (min = max new tokens)."""

    def __init__(self, model_dir: str, dtype: str) -> None:
        from serving.analysis.attention import load_analysis_model

        self.model, self.tokenizer = load_analysis_model(model_dir, dtype)
        self.tokenizer.padding_side = "left"  # decoder-only: pad before the prompt
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def encode(self, prompts: list[str]) -> Any:
        return self.tokenizer(prompts, return_tensors="pt", padding=True)

    def prompt_lengths(self, prompts: list[str]) -> list[int]:
        return [len(self.tokenizer(p).input_ids) for p in prompts]

    def generate(self, prompts: list[str], new_tokens: int) -> Any:
        import torch

        batch = self.encode(prompts)
        model = cast(Generates, self.model)  # an AutoModelForCausalLM: its classes all generate
        with torch.inference_mode():
            return model.generate(
                **batch,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )


class VLLMRunner:
    """The vLLM engine in this process (offline `LLM`, no engine-core process), same arguments
    as the platform's vLLM deployment."""

    def __init__(self, config: PlatformConfig, model_dir: str) -> None:
        from serving.engines.vllm import vllm_env
        from serving.engines.vllm_args import engine_options

        for key, value in {**vllm_env(config), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
            os.environ.setdefault(key, value)
        from vllm import LLM

        self.llm = LLM(**engine_options(config, model_dir))

    def generate(self, prompts: list[str], new_tokens: int) -> Any:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0)
        return self.llm.generate(prompts, params, use_tqdm=False)

    def shutdown(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def one_prompt(hf_s: float, vllm: VLLMRunner, args: SuiteArgs) -> dict[str, Any]:
    vllm_s = median_seconds(lambda: vllm.generate([SEED_PROMPTS[0]], args.new_tokens), args.repeats)
    return {
        "new_tokens": args.new_tokens,
        "hf_generate_s": hf_s,
        "vllm_s": vllm_s,
        "speedup": hf_s / vllm_s,
    }


def kv_cache_latency(hf: HFRunner, args: SuiteArgs) -> dict[str, Any]:
    from serving.analysis.latency import generation_trace

    traces = {
        mode: generation_trace(hf.model, hf.tokenizer, SEED_PROMPTS[1], args.new_tokens, mode)
        for mode in ("no-cache", "kv-cache")
    }
    keep = ("latencies_ms", "first_token_ms", "mean_decode_ms", "total_ms", "growth")
    result: dict[str, Any] = {mode: {k: t[k] for k in keep} for mode, t in traces.items()}
    result["prompt_tokens"] = traces["kv-cache"]["prompt_tokens"]
    result["total_speedup"] = traces["no-cache"]["total_ms"] / traces["kv-cache"]["total_ms"]
    return result


def four_prompts(hf: HFRunner, args: SuiteArgs) -> dict[str, Any]:
    prompts = batch_prompts(4)

    def one_by_one() -> None:
        for prompt in prompts:
            hf.generate([prompt], args.new_tokens)

    sequential_s = median_seconds(one_by_one, args.repeats)
    batched_s = median_seconds(lambda: hf.generate(prompts, args.new_tokens), args.repeats)
    return {
        "prompts": 4,
        "new_tokens": args.new_tokens,
        "one_by_one_s": sequential_s,
        "batched_s": batched_s,
        "speedup": sequential_s / batched_s,
    }


def batch_efficiency(
    engine: str, runner: HFRunner | VLLMRunner, args: SuiteArgs
) -> list[dict[str, Any]]:
    """Output tokens/s at each batch size; efficiency = tokens/s per sequence vs batch 1."""
    rows, single = [], None
    for size in (1, *args.batch_sizes):
        prompts = batch_prompts(size)
        seconds = median_seconds(functools.partial(runner.generate, prompts, args.new_tokens), 1)
        single = single or seconds
        speedup = size * single / seconds
        rows.append(
            {
                "engine": engine,
                "batch": size,
                "seconds": seconds,
                "output_tokens_per_s": size * args.new_tokens / seconds,
                "speedup": speedup,
                "efficiency": speedup / size,
            }
        )
    return rows


def static_batch_waste(hf: HFRunner, args: SuiteArgs) -> dict[str, Any]:
    """A batch of the 4 seed prompts (different lengths) wanting different output lengths."""
    prompts = list(SEED_PROMPTS)
    outputs = [max(1, round(args.new_tokens * f)) for f in MIXED_OUTPUT_FRACTIONS]

    def one_by_one() -> None:
        for prompt, n in zip(prompts, outputs, strict=True):
            hf.generate([prompt], n)

    sequential_s = median_seconds(one_by_one, args.repeats)
    # generate() stops a batch only when every row is done, so it runs to the longest output.
    batched_s = median_seconds(lambda: hf.generate(prompts, max(outputs)), args.repeats)
    single_step_s = median_seconds(lambda: hf.generate(prompts[:1], max(outputs)), args.repeats)
    full_step_s = median_seconds(lambda: hf.generate([prompts[0]] * 4, max(outputs)), args.repeats)
    pad, prompt_total = padding_slots(hf.prompt_lengths(prompts))
    idle, decode_total = idle_slots(outputs)
    useful = 1 - idle / decode_total
    step_cost = full_step_s / single_step_s
    return {
        "prompt_tokens": hf.prompt_lengths(prompts),
        "output_tokens": outputs,
        "padding_waste": pad / prompt_total,
        "idle_waste": idle / decode_total,
        "one_by_one_s": sequential_s,
        "batched_s": batched_s,
        "measured_speedup": sequential_s / batched_s,
        "batch_step_cost_ratio": step_cost,
        "expected_speedup": expected_speedup(len(prompts), useful, step_cost),
    }


def run_suite(
    config: PlatformConfig, args: SuiteArgs, progress: Callable[[str], None]
) -> dict[str, Any]:
    from serving.models import resolve_model

    model_dir = str(resolve_model(config.model.ref, config.model.cache_dir))
    progress("loading the transformers model")
    hf = HFRunner(model_dir, config.model.dtype)
    document: dict[str, Any] = {
        "model_id": config.model.name,
        "dtype": config.model.dtype,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
    }
    # Every transformers timing comes first: the in-process vLLM engine pins this process's
    # OpenMP threads to its own cores, which would slow generate() measured after it.
    progress("a. one prompt through generate()")
    hf_one_s = median_seconds(lambda: hf.generate([SEED_PROMPTS[0]], args.new_tokens), args.repeats)
    progress("b. per-token latency without vs with the KV cache")
    document["kv_cache"] = kv_cache_latency(hf, args)
    progress("c. 4 prompts batched vs one by one")
    document["four_prompts"] = four_prompts(hf, args)
    progress("e. static batching waste")
    document["static_batch_waste"] = static_batch_waste(hf, args)
    progress(f"d. generate() at batch sizes {', '.join(map(str, args.batch_sizes))}")
    efficiency = batch_efficiency("hf", hf, args)
    progress("starting the vLLM engine in-process")
    vllm = VLLMRunner(config, model_dir)
    try:
        progress("a. one prompt through vLLM")
        document["one_prompt"] = one_prompt(hf_one_s, vllm, args)
        progress(f"d. vLLM at batch sizes {', '.join(map(str, args.batch_sizes))}")
        document["batch_efficiency"] = efficiency + batch_efficiency("vllm", vllm, args)
    finally:
        vllm.shutdown()
    return document


@dataclass(frozen=True)
class SeedArgs:
    """`bench seed`: the options as given (--batch-sizes a comma list)."""

    config_path: str | None
    output_len: int
    batch_sizes: str
    repeats: int


def run_seed(args: SeedArgs) -> Report:
    """The suite on --config's model."""
    import click

    from serving.config import load_config
    from serving.loadgen.scenarios import seed_report

    config = load_config(args.config_path)
    sizes = tuple(parse_list(args.batch_sizes, int, "--batch-sizes"))
    suite = SuiteArgs(args.output_len, sizes, args.repeats)
    doc = run_suite(config, suite, lambda step: click.echo(f"seed suite: {step} ...", err=True))
    return seed_report.report(doc)

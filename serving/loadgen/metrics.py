"""Pure metric maths over recorded requests, computed as vLLM's `bench serve` computes them and
named as its result files name them (`request_throughput`, `median_ttft_ms`, `p99_itl_ms`, ...),
so tools that read vLLM result files read ours."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from serving.loadgen.client import NOT_STARTED, RequestResult

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")


class SLOError(ValueError):
    """A `--slo` string that does not parse."""


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft:500,tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition(":")
        if not sep or name not in SLO_METRICS:
            raise SLOError(f"bad --slo item {part!r}: expected NAME:MS with NAME in {SLO_METRICS}")
        try:
            slo[name] = float(value)
        except ValueError:
            raise SLOError(f"bad --slo item {part!r}: {value!r} is not a number") from None
        if not math.isfinite(slo[name]) or slo[name] <= 0:
            raise SLOError(f"bad --slo item {part!r}: the limit must be a positive number of ms")
    return slo


def percentile(values: Iterable[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default, as vLLM); 0 for no values."""
    data = list(values)
    return float(np.percentile(data, p)) if data else 0.0


def tpot(result: RequestResult) -> float | None:
    """Time per output token after the first; None for a single-token answer."""
    if result.output_tokens <= 1:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def distribution(
    name: str, values_s: list[float], percentiles: Iterable[float]
) -> dict[str, float]:
    """mean/median/std/pNN of one latency metric, in milliseconds, with vLLM's key names."""
    ms = [v * 1000 for v in values_s]
    stats = {
        f"mean_{name}_ms": float(np.mean(ms)) if ms else 0.0,
        f"median_{name}_ms": percentile(ms, 50),
        f"std_{name}_ms": float(np.std(ms)) if ms else 0.0,
    }
    for p in percentiles:
        word = str(int(p)) if float(p).is_integer() else str(p)
        stats[f"p{word}_{name}_ms"] = percentile(ms, p)
    return stats


def latency_values(ok: list[RequestResult]) -> dict[str, list[float]]:
    return {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for r in ok if (t := tpot(r)) is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }


def is_good(result: RequestResult, slo: Mapping[str, float]) -> bool:
    """Within every SLO (ms); a single-token answer has TPOT 0, as in vLLM."""
    values = {"ttft": result.ttft, "tpot": tpot(result) or 0.0, "e2el": result.latency}
    return all(values[name] * 1000 <= limit for name, limit in slo.items())


def max_concurrent(results: list[RequestResult]) -> int:
    """Most requests in flight at once, seen from the client (exact, by sweeping start/end)."""
    events = [(r.start_time, 1) for r in results] + [
        (r.start_time + r.latency, -1) for r in results
    ]
    most = current = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        current += step
        most = max(most, current)
    return most


def failures_by_status(results: list[RequestResult]) -> dict[str, int]:
    return dict(Counter(r.status for r in results if not r.success and r.status != NOT_STARTED))


def summarize(
    results: list[RequestResult],
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    percentiles: Iterable[float] = PERCENTILES,
) -> dict[str, Any]:
    """The aggregate fields of a vLLM `bench serve` result for one target at one load level."""
    ok = [r for r in results if r.success]
    started = [r for r in results if r.status != NOT_STARTED]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    summary: dict[str, Any] = {
        "num_prompts": len(results),
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(started) - len(ok),
        "not_started": len(results) - len(started),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "request_goodput": sum(is_good(r, slo) for r in ok) / duration_s if slo else None,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "max_concurrent_requests": max_concurrent(started),
        "failures": failures_by_status(results),
    }
    percentiles = list(percentiles)
    for name, values in latency_values(ok).items():
        summary.update(distribution(name, values, percentiles))
    summary["prefix_cache_hit_rate"] = prefix_cache_hit_rate(ok)
    replicas = sorted({r.replica for r in ok if r.replica})
    if replicas:  # the platform names the replica that answered each request
        summary["per_replica"] = {
            replica: replica_summary([r for r in ok if r.replica == replica])
            for replica in replicas
        }
    models = sorted({r.model for r in results})
    if len(models) > 1:  # `--model-mix`: the same figures per model
        summary["per_model"] = {
            model: summarize([r for r in results if r.model == model], duration_s, slo, percentiles)
            for model in models
        }
    return summary


def prefix_cache_hit_rate(ok: list[RequestResult]) -> float | None:
    """Share of prompt tokens the server found in its prefix cache (`usage.prompt_tokens_details.
    cached_tokens`; vLLM reports it with --enable-prompt-tokens-details); None when not reported."""
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_len for r in reported)
    return sum(r.cached_tokens or 0 for r in reported) / prompt if prompt else None


def replica_summary(ok: list[RequestResult]) -> dict[str, Any]:
    return {
        "completed": len(ok),
        "models": sorted({r.model for r in ok}),
        "prefix_cache_hit_rate": prefix_cache_hit_rate(ok),
        "median_ttft_ms": percentile([r.ttft * 1000 for r in ok], 50),
    }


def raw_fields(results: list[RequestResult]) -> dict[str, list[Any]]:
    """Per-request lists of a vLLM result file (for tools that re-plot distributions)."""
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_tokens if r.success else 0 for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "latencies": [r.latency for r in results],
        "start_times": [r.start_time for r in results],
        "errors": [r.error for r in results],
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def ratios(subject: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, float | None]:
    """`<field>_ratio` = subject / other for every numeric field both have (None when other is 0);
    `<field>_diff` = subject - other for the millisecond fields (e.g. a TTFT difference)."""
    out: dict[str, float | None] = {}
    for key, value in subject.items():
        theirs = other.get(key)
        if not (_number(value) and _number(theirs)):
            continue
        out[f"{key}_ratio"] = value / theirs if theirs else None
        if key.endswith("_ms"):
            out[f"{key}_diff"] = value - theirs
    return out

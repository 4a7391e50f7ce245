"""KV-cache arithmetic: every generated token keeps one key and one value vector per layer and KV
head, so memory grows linearly with context x batch. GQA shrinks it by query heads / KV heads."""

from __future__ import annotations

from typing import Any

from serving.analysis import AnalysisInputError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
GIB = 2**30  # memory budgets are GiB: accelerator memory is sized in powers of two
# Beyond any machine; found by fuzzing: int(memory_gb * GIB) overflows (a 500) near 1e299.
MAX_MEMORY_GB = 1e9


def allowed_dtypes() -> list[str]:
    return [*DTYPE_BYTES, *DTYPE_ALIASES]


def canonical_dtype(dtype: str) -> str:
    name = str(dtype).removeprefix("torch.").lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise AnalysisInputError(
            f"unknown dtype '{dtype}'; allowed: {', '.join(allowed_dtypes())}", param="dtype"
        )
    return name


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[canonical_dtype(dtype)]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """2 (K and V) x layers x KV heads x head dim x bytes per element."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes(dtype)


def kv_cache_bytes(bytes_per_token: int, tokens: int, batch: int) -> int:
    return bytes_per_token * tokens * batch


def tokens_fitting(budget_bytes: int, bytes_per_token: int) -> int:
    """Cached tokens (summed over all sequences) a memory budget holds."""
    return budget_bytes // bytes_per_token


def require_positive(value: float, name: str) -> None:
    if value <= 0:
        raise AnalysisInputError(f"{name} must be positive, got {value}", param=name)


def kv_cache_report(
    num_layers: int,
    num_query_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
    tokens: int,
    batch: int = 1,
    memory_gb: float = 1.0,
) -> dict[str, Any]:
    """Bytes per token, the total for `tokens` x `batch`, the saving against full multi-head
    attention (one KV head per query head) and how many tokens fit in `memory_gb` GiB."""
    for value, name in ((tokens, "tokens"), (batch, "batch"), (memory_gb, "memory_gb")):
        require_positive(value, name)
    if not memory_gb <= MAX_MEMORY_GB:  # `not <=` also refuses inf
        raise AnalysisInputError(
            f"memory_gb must be at most {MAX_MEMORY_GB:g}, got {memory_gb:g}", param="memory_gb"
        )
    name = canonical_dtype(dtype)
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, name)
    per_token_mha = kv_bytes_per_token(num_layers, num_query_heads, head_dim, name)
    total = kv_cache_bytes(per_token, tokens, batch)
    total_mha = kv_cache_bytes(per_token_mha, tokens, batch)
    budget = int(memory_gb * GIB)
    return {
        "dtype": name,
        "dtype_bytes": DTYPE_BYTES[name],
        "formula": f"2 x {num_layers} layers x {num_kv_heads} kv_heads x {head_dim} head_dim "
        f"x {DTYPE_BYTES[name]} bytes",
        "bytes_per_token": per_token,
        "tokens": tokens,
        "batch": batch,
        "total_bytes": total,
        "total_mib": round(total / 2**20, 3),
        "mha": {
            "kv_heads": num_query_heads,
            "bytes_per_token": per_token_mha,
            "total_bytes": total_mha,
        },
        "saving": {
            "factor": num_query_heads / num_kv_heads,
            "bytes": total_mha - total,
            "fraction": round(1 - per_token / per_token_mha, 6),
        },
        "budget": {
            "memory_gb": memory_gb,
            "bytes": budget,
            "tokens_fit": tokens_fitting(budget, per_token),
            "tokens_fit_mha": tokens_fitting(budget, per_token_mha),
            "sequences_fit": tokens_fitting(budget, per_token * tokens),
        },
    }


def kv_cache_report_for(
    summary: dict[str, Any], tokens: int, batch: int, dtype: str | None, memory_gb: float
) -> dict[str, Any]:
    """kv_cache_report from an architecture summary; dtype None or 'auto' = the model's dtype."""
    chosen = summary["dtype"] if dtype in (None, "auto") else dtype
    return kv_cache_report(
        summary["num_layers"],
        summary["num_query_heads"],
        summary["num_kv_heads"],
        summary["head_dim"],
        chosen,
        tokens,
        batch,
        memory_gb,
    )

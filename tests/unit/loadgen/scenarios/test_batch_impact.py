"""`bench batch`'s pure parts: the batch file it uploads, the per-condition figures, the gate."""

from __future__ import annotations

import json

import openai.types
import pytest

from serving.loadgen.client import RequestResult
from serving.loadgen.scenarios.batch_impact import (
    BatchImpactArgs,
    Phase,
    batch_document,
    batch_file,
)


def args(**given: object) -> BatchImpactArgs:
    values: dict[str, object] = dict(
        target_items=(), model=None, endpoint="completions", request_timeout=60.0,
        free_length=False, num_requests=8, prompts="synthetic", turns=1, prefix_len=1,
        context_len=0, input_len=16, output_len=8, range_ratio=0.0, tokenizer_ref=None,
        model_mix=None, seed=0, concurrency=4, duration=5.0, dashboard=None, rounds=1,
        batch_lines=3, batch_output_len=4, max_ttft_ratio=None,
    )  # fmt: skip
    return BatchImpactArgs(**(values | given))  # type: ignore[arg-type]  # the options' values


@pytest.mark.parametrize(
    ("endpoint", "url", "field"),
    [("completions", "/v1/completions", "prompt"), ("chat", "/v1/chat/completions", "messages")],
)
def test_the_batch_file_is_one_openai_request_per_line(endpoint: str, url: str, field: str) -> None:
    rows = [json.loads(line) for line in batch_file("m", endpoint, 3, 7).decode().splitlines()]
    assert [row["custom_id"] for row in rows] == ["line-0", "line-1", "line-2"]
    assert {row["url"] for row in rows} == {url} and {row["method"] for row in rows} == {"POST"}
    assert all(row["body"]["max_tokens"] == 7 and field in row["body"] for row in rows)


def result(ttft: float, latency: float, tokens: int = 11) -> RequestResult:
    return RequestResult(success=True, ttft=ttft, latency=latency, output_tokens=tokens)


def batch_stats(lines_per_s: float) -> dict[str, object]:
    return {"id": "batch_x", "lines": 10, "completion_tokens": 40, "seconds": 10.0,
            "lines_per_s": lines_per_s, "tokens_per_s": 4 * lines_per_s}  # fmt: skip


def phases(busy_ttft: float) -> list[Phase]:
    alone = [result(0.1, 1.1), result(0.1, 1.1)]
    busy = [result(busy_ttft, 1.0 + busy_ttft), result(busy_ttft, 1.0 + busy_ttft)]
    return [
        Phase("alone", 0, alone, 10.0),
        Phase("batch", 0, busy, 10.0, batch_stats(1.0)),
        Phase("alone", 1, alone, 10.0),
        Phase("batch", 1, busy, 10.0, batch_stats(3.0)),
    ]


def test_the_ratio_is_with_a_batch_over_alone_and_gates() -> None:
    doc = batch_document(args(max_ttft_ratio=1.25), "m", phases(busy_ttft=0.12))
    assert doc["online"]["alone"]["ttft_p50_ms"] == 100.0
    assert doc["online"]["with_batch"]["ttft_p50_ms"] == 120.0
    assert doc["ratios"]["ttft_p50"] == 1.2 and doc["ratios"]["tpot_p50"] == 1.0
    assert doc["batch_lines_per_s"] == 2.0  # the mean over the batch phases
    assert doc["passed"]
    assert not batch_document(args(max_ttft_ratio=1.25), "m", phases(0.2))["passed"]


def test_a_failed_online_request_fails_the_run() -> None:
    runs = phases(busy_ttft=0.1)
    runs[1].results.append(RequestResult(success=False, status="http_500"))
    assert not batch_document(args(), "m", runs)["passed"]


def test_the_batch_endpoints_are_openais() -> None:
    # The file's urls must be ones OpenAI's Batch API (and so the SDK's types) accepts.
    allowed = openai.types.batch_create_params.BatchCreateParams.__annotations__["endpoint"]
    for endpoint in ("completions", "chat"):
        url = json.loads(batch_file("m", endpoint, 1, 1).decode())["url"]
        assert url in str(allowed)

"""`llm-serving bench batch`: what a running batch (the OpenAI Batch API) costs online traffic.
Phases alternate in one run (alone, with a batch, alone, ...): each "with" phase uploads a batch,
waits until it runs, keeps --concurrency online streams in a closed loop for --duration seconds,
then cancels the batch and waits until its lines in flight ended, so the next "alone" phase runs
on an idle engine. Reported: online TTFT / TPOT p50 per condition and their ratio (gated by
--max-ttft-ratio), and the batch's own throughput (lines and completion tokens per second)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import openai

from serving.loadgen import client
from serving.loadgen.args import StepArgs, UsageError, build_requests, check_targets, one_target
from serving.loadgen.metrics import latency_values, percentile
from serving.loadgen.report import Report
from serving.loadgen.workloads import RequestSpec

ENDED = {"completed", "failed", "expired", "cancelled"}
POLL_S = 0.5


@dataclass(frozen=True)
class BatchImpactArgs(StepArgs):
    rounds: int
    batch_lines: int
    batch_output_len: int
    max_ttft_ratio: float | None


@dataclass
class Phase:
    condition: str  # alone | batch
    round: int
    results: list[client.RequestResult]
    elapsed_s: float
    batch: dict[str, Any] | None = None  # lines and tokens the batch finished, over its run time


def batch_file(model: str, endpoint: str, lines: int, output_len: int) -> bytes:
    """A batch input file: `lines` requests of `output_len` tokens each (ignore_eos: equal work)."""
    url = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    rows = []
    for n in range(lines):
        body: dict[str, Any] = {"model": model, "max_tokens": output_len, "ignore_eos": True}
        text = f"Batch item {n}: write a long story about the sea."
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        rows.append({"custom_id": f"line-{n}", "method": "POST", "url": url, "body": body})
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


async def wait_status(
    api: openai.AsyncOpenAI, batch_id: str, done: set[str], limit_s: float
) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        batch = await api.batches.retrieve(batch_id)
        if batch.status in done:
            return batch
        if time.monotonic() > deadline:
            raise client.TargetError(f"batch {batch_id} still {batch.status} after {limit_s:.0f} s")
        await asyncio.sleep(POLL_S)


async def wait_running(api: openai.AsyncOpenAI, batch_id: str, limit_s: float) -> None:
    """Until the batch's first lines finished: its runners are busy when the phase starts."""
    deadline = time.monotonic() + limit_s
    while True:
        batch = await api.batches.retrieve(batch_id)
        counts = batch.request_counts
        if batch.status in ENDED or (counts and counts.completed > 0):
            return
        if time.monotonic() > deadline:
            raise client.TargetError(f"batch {batch_id} ran no line within {limit_s:.0f} s")
        await asyncio.sleep(POLL_S)


async def closed_loop(
    http: openai.AsyncOpenAI,
    opts: client.RequestOptions,
    specs: list[RequestSpec],
    concurrency: int,
    duration_s: float,
) -> tuple[list[client.RequestResult], float]:
    """`concurrency` workers sending the next prompt as soon as the last ended, until the
    duration; each request bounded by the request timeout."""
    results: list[client.RequestResult] = []
    start = time.perf_counter()
    deadline = start + duration_s

    async def worker(first: int) -> None:
        i = first
        while time.perf_counter() < deadline:
            results.append(await client.send_request(http, opts, specs[i % len(specs)]))
            i += concurrency

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return results, time.perf_counter() - start


async def batch_throughput(api: openai.AsyncOpenAI, batch: Any) -> dict[str, Any]:
    """Lines and completion tokens the batch finished per second of its run (in progress to
    cancelled), read from its output file."""
    tokens = lines = 0
    if batch.output_file_id:
        content = await api.files.content(batch.output_file_id)
        for row in content.text.splitlines():
            usage = ((json.loads(row).get("response") or {}).get("body") or {}).get("usage")
            lines += 1
            tokens += (usage or {}).get("completion_tokens", 0)
    ended = batch.cancelled_at or batch.completed_at or time.time()
    seconds = max(ended - (batch.in_progress_at or batch.created_at), 1e-9)
    return {
        "id": batch.id,
        "lines": lines,
        "completion_tokens": tokens,
        "seconds": round(seconds, 1),
        "lines_per_s": round(lines / seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
    }


async def with_batch(
    api: openai.AsyncOpenAI, args: BatchImpactArgs, model: str, run: Any
) -> tuple[list[client.RequestResult], float, dict[str, Any]]:
    data = batch_file(model, args.endpoint, args.batch_lines, args.batch_output_len)
    upload = await api.files.create(file=("bench-batch.jsonl", io.BytesIO(data)), purpose="batch")
    url: Literal["/v1/chat/completions", "/v1/completions"] = (
        "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    )
    batch = await api.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")
    try:
        await wait_running(api, batch.id, args.request_timeout)
        results, elapsed = await run()
    finally:
        await api.batches.cancel(batch.id)
        ended = await wait_status(api, batch.id, ENDED, args.request_timeout)
    return results, elapsed, await batch_throughput(api, ended)


async def run_phases(args: BatchImpactArgs) -> tuple[str, list[Phase]]:
    target = one_target(args, "batch")
    model = await check_targets([target], args.model)
    opts = client.RequestOptions(
        model, args.endpoint, not args.free_length, timeout_s=args.request_timeout
    )
    specs = build_requests(args)
    http = client.make_client(target, opts)
    api = openai.AsyncOpenAI(
        base_url=target.base_url, api_key=opts.api_key or "unused", max_retries=0
    )
    phases: list[Phase] = []
    try:
        for n in range(args.rounds):

            def run() -> Any:
                return closed_loop(http, opts, specs, args.concurrency, args.duration)

            results, elapsed = await run()
            phases.append(Phase("alone", n, results, elapsed))
            results, elapsed, batch = await with_batch(api, args, model, run)
            phases.append(Phase("batch", n, results, elapsed, batch))
    finally:
        await http.close()
        await api.close()
    return model, phases


def condition_summary(phases: list[Phase]) -> dict[str, Any]:
    ok = [r for p in phases for r in p.results if r.success]
    values = latency_values(ok)
    seconds = sum(p.elapsed_s for p in phases)
    return {
        "requests": len(ok),
        "failed": sum(1 for p in phases for r in p.results if not r.success),
        "ttft_p50_ms": round(percentile(values["ttft"], 50) * 1000, 1),
        "tpot_p50_ms": round(percentile(values["tpot"], 50) * 1000, 2),
        "output_throughput": round(sum(r.output_tokens for r in ok) / seconds, 2),
    }


def ratio(subject: float, base: float) -> float | None:
    return round(subject / base, 3) if base else None


def batch_document(args: BatchImpactArgs, model: str, phases: list[Phase]) -> dict[str, Any]:
    alone = condition_summary([p for p in phases if p.condition == "alone"])
    busy = condition_summary([p for p in phases if p.condition == "batch"])
    batches = [p.batch for p in phases if p.batch]
    ttft_ratio = ratio(busy["ttft_p50_ms"], alone["ttft_p50_ms"])
    gate = args.max_ttft_ratio
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "model_id": model,
        "concurrency": args.concurrency,
        "phase_s": args.duration,
        "rounds": args.rounds,
        "batch_output_len": args.batch_output_len,
        "online": {"alone": alone, "with_batch": busy},
        "ratios": {
            "ttft_p50": ttft_ratio,
            "tpot_p50": ratio(busy["tpot_p50_ms"], alone["tpot_p50_ms"]),
            "output_throughput": ratio(busy["output_throughput"], alone["output_throughput"]),
        },
        "batches": batches,
        "batch_lines_per_s": round(sum(b["lines_per_s"] for b in batches) / len(batches), 3),
        "batch_tokens_per_s": round(sum(b["tokens_per_s"] for b in batches) / len(batches), 2),
        "max_ttft_ratio": gate,
        "passed": busy["failed"] == 0
        and alone["failed"] == 0
        and (gate is None or (ttft_ratio is not None and ttft_ratio <= gate)),
    }


def console_lines(doc: dict[str, Any]) -> list[str]:
    alone, busy, r = doc["online"]["alone"], doc["online"]["with_batch"], doc["ratios"]
    return [
        f"online c{doc['concurrency']} alone: TTFT p50 {alone['ttft_p50_ms']} ms, TPOT p50 "
        f"{alone['tpot_p50_ms']} ms, {alone['output_throughput']} tok/s ({alone['requests']} req)",
        f"online c{doc['concurrency']} with a batch: TTFT p50 {busy['ttft_p50_ms']} ms, TPOT p50 "
        f"{busy['tpot_p50_ms']} ms, {busy['output_throughput']} tok/s ({busy['requests']} req)",
        f"ratios with/alone: TTFT p50 {r['ttft_p50']}x, TPOT p50 {r['tpot_p50']}x, online "
        f"throughput {r['output_throughput']}x; batch: {doc['batch_lines_per_s']} lines/s, "
        f"{doc['batch_tokens_per_s']} tok/s",
    ]


def markdown(doc: dict[str, Any]) -> str:
    rows = [
        f"| {name} | {s['requests']} | {s['failed']} | {s['ttft_p50_ms']} | {s['tpot_p50_ms']} "
        f"| {s['output_throughput']} |"
        for name, s in doc["online"].items()
    ]
    batches = [
        f"| {b['id']} | {b['lines']} | {b['seconds']} | {b['lines_per_s']} | {b['tokens_per_s']} |"
        for b in doc["batches"]
    ]
    return "\n".join(
        [
            f"# Online latency with a batch running, {doc['date']}",
            "",
            *(f"- {line}" for line in console_lines(doc)),
            "",
            "| online | requests | failed | TTFT p50 ms | TPOT p50 ms | output tok/s |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "| batch | lines | run s | lines/s | tok/s |",
            "|---|---|---|---|---|",
            *batches,
            "",
        ]
    )


def run_batch_impact(args: BatchImpactArgs) -> Report:
    if args.duration is None or args.duration <= 0:
        raise UsageError("--duration: seconds of each phase, required")
    model, phases = asyncio.run(run_phases(args))
    doc = batch_document(args, model, phases)
    doc["phases"] = [
        {"condition": p.condition, "round": p.round, "requests": len(p.results), "batch": p.batch}
        for p in phases
    ]
    return Report("batch", doc, markdown(doc), console_lines(doc), passed=doc["passed"])

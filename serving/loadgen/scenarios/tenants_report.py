"""`bench tenants`' pure parts: per-tenant figures of a phase, Jain's fairness index, each
target's summary, the ratios to the baseline target, the `--require` gates and the report.

Served tokens: a tenant's successful requests' prompt + output tokens (the engine's own usage
counts), as the platform's fair share charges them. A tenant's token throughput in a phase is its
served tokens over its own time in the phase (the phase's start to its last answer).

Jain's fairness index, J = (sum x)^2 / (n * sum x^2), 1 when every x is equal, 1/n when one
tenant got everything. Here x_i = T_i / O_i (Jain, Chiu and Hawe's "normalised throughput"):
T_i is tenant i's token throughput in the mixed phase, O_i its max-min fair share of the mixed
phase's total throughput (sum T) with each tenant's demand capped at what it used alone (its solo
token throughput on the same target): a closed-loop tenant whose few requests cannot use an equal
share is owed only what it can use, and the rest is the others'. So J is 1 when every tenant got
what a fair scheduler owes it, and falls as one is starved (the quiet tenant behind the noisy
one's queue, first come first served). Even a fair scheduler leaves the quiet tenant a little
below its solo throughput (its requests share the engine's batch), so J stays a little under 1.
`jain_raw` is the unnormalised index over T_i (equal shares, demand ignored): a quiet tenant that
cannot use half the engine lowers it whatever the scheduler does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serving.loadgen import metrics, require
from serving.loadgen.client import NOT_STARTED, RequestResult
from serving.loadgen.report import Report

# Gates: `[TARGET.]METRIC OP N` for a target's figure, `[TARGET.]METRIC@TENANT OP N` for a tenant's.
TARGET_METRICS = (
    "jain",
    "jain_raw",
    "quiet_ttft_p50_ratio",
    "quiet_ttft_p99_ratio",
    "mixed_token_throughput",
    "solo_throughput_ratio",
    "solo_ttft_p50_ratio",
    "failed",
)
TENANT_METRICS = (
    "fair_ratio",
    "share",
    "ttft_p50_ratio",
    "ttft_p99_ratio",
    "mixed_token_throughput",
    "mixed_ttft_p50_ms",
    "mixed_ttft_p99_ms",
    "solo_token_throughput",
    "solo_ttft_p50_ms",
    "solo_ttft_p99_ms",
)


@dataclass
class PhaseRun:
    """One phase on one target: each tenant's requests, and when the phase started (the
    requests' perf_counter clock)."""

    results: dict[str, list[RequestResult]]
    start: float


def jain_index(values: Sequence[float]) -> float | None:
    """(sum x)^2 / (n * sum x^2); None for no values or all zero."""
    squares = sum(x * x for x in values)
    if not values or squares == 0:
        return None
    return sum(values) ** 2 / (len(values) * squares)


def max_min_shares(capacity: float, demands: Sequence[float]) -> list[float]:
    """Water-filling: equal shares of `capacity`, none above its demand, what a capped tenant
    leaves split between the others."""
    shares = [0.0] * len(demands)
    open_ = set(range(len(demands)))
    left = capacity
    while open_:
        each = left / len(open_)
        capped = {i for i in open_ if demands[i] <= each}
        if not capped:
            for i in open_:
                shares[i] = each
            break
        for i in capped:
            shares[i] = demands[i]
            left -= demands[i]
        open_ -= capped
    return shares


def _ms(values: list[float], p: float) -> float | None:
    return round(metrics.percentile(values, p) * 1000, 1) if values else None


def tenant_summary(results: list[RequestResult], start: float) -> dict[str, Any]:
    """A tenant's figures in one phase: requests, served tokens and their rate, TTFT p50/p99."""
    started = [r for r in results if r.status != NOT_STARTED]
    ok = [r for r in started if r.success]
    prompt, output = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    end = max((r.start_time + r.latency for r in started), default=start)
    seconds = max(end - start, 1e-9)
    ttft = [r.ttft for r in ok]
    return {
        "requests": len(started),
        "completed": len(ok),
        "failed": len(started) - len(ok),
        "seconds": round(seconds, 2),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "served_tokens": prompt + output,
        "token_throughput": round((prompt + output) / seconds, 2),
        "output_throughput": round(output / seconds, 2),
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
    }


def ratio(subject: float | None, base: float | None) -> float | None:
    return None if subject is None or not base else round(subject / base, 3)


def _worst(values: list[float | None]) -> float | None:
    return None if not values or None in values else max(v for v in values if v is not None)


def target_summary(
    name: str,
    base_url: str,
    tenants: list[tuple[str, bool]],
    solo: dict[str, PhaseRun],
    mixed: PhaseRun,
) -> dict[str, Any]:
    """One target's figures; `tenants` are (name, noisy) in the order given."""
    per: dict[str, dict[str, Any]] = {}
    for tenant, _ in tenants:
        alone = tenant_summary(solo[tenant].results[tenant], solo[tenant].start)
        together = tenant_summary(mixed.results[tenant], mixed.start)
        per[tenant] = {
            "solo": alone,
            "mixed": together,
            "ttft_p50_ratio": ratio(together["ttft_p50_ms"], alone["ttft_p50_ms"]),
            "ttft_p99_ratio": ratio(together["ttft_p99_ms"], alone["ttft_p99_ms"]),
        }
    served = [per[t]["mixed"]["token_throughput"] for t, _ in tenants]
    fair = max_min_shares(sum(served), [per[t]["solo"]["token_throughput"] for t, _ in tenants])
    for (tenant, _), got, owed in zip(tenants, served, fair, strict=True):
        per[tenant]["fair_share_tokens_per_s"] = round(owed, 2)
        per[tenant]["fair_ratio"] = ratio(got, owed)
        per[tenant]["share"] = ratio(got, sum(served))
    ratios = [per[t]["fair_ratio"] for t, _ in tenants]
    quiet = [t for t, noisy in tenants if not noisy]
    jain = None if None in ratios else jain_index(ratios)
    raw = jain_index(served)
    failed = sum(p["failed"] for t in per.values() for p in (t["solo"], t["mixed"]))
    return {
        "name": name,
        "base_url": base_url,
        "tenants": per,
        "jain": None if jain is None else round(jain, 4),
        "jain_raw": None if raw is None else round(raw, 4),
        "mixed_token_throughput": round(sum(served), 2),
        "quiet_ttft_p50_ratio": _worst([per[t]["ttft_p50_ratio"] for t in quiet]),
        "quiet_ttft_p99_ratio": _worst([per[t]["ttft_p99_ratio"] for t in quiet]),
        "single_tenant": {"tenant": quiet[0], **per[quiet[0]]["solo"]},
        "failed": failed,
    }


def with_baseline(targets: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """The single-tenant overhead: each target's first quiet tenant alone, over the baseline's."""
    base = next(t for t in targets if t["name"] == baseline)["single_tenant"]
    return [
        {
            **t,
            "solo_throughput_ratio": ratio(
                t["single_tenant"]["token_throughput"], base["token_throughput"]
            ),
            "solo_ttft_p50_ratio": ratio(t["single_tenant"]["ttft_p50_ms"], base["ttft_p50_ms"]),
        }
        for t in targets
    ]


def validate_gates(reqs: list[require.Requirement], targets: list[str], tenants: list[str]) -> None:
    """Fail before the run for an unknown metric, target or tenant."""
    for req in reqs:
        bad = f"bad --require {req.text!r}"
        if req.metric in TARGET_METRICS and req.level is None:
            pass
        elif req.metric in TARGET_METRICS:
            raise require.RequireError(f"{bad}: {req.metric} is a target's figure, not a tenant's")
        elif req.metric not in TENANT_METRICS:
            known = ", ".join(TARGET_METRICS + tuple(f"{m}@TENANT" for m in TENANT_METRICS))
            raise require.RequireError(f"{bad}: unknown metric {req.metric!r} (known: {known})")
        elif req.level not in tenants:
            raise require.RequireError(f"{bad}: name a tenant, {req.metric}@TENANT of {tenants}")
        if req.target is not None and req.target not in targets:
            raise require.RequireError(f"{bad}: no target named {req.target!r}")


def measured(req: require.Requirement, doc: dict[str, Any]) -> tuple[Any, str]:
    target = next(t for t in doc["targets"] if t["name"] == (req.target or doc["subject"]))
    if req.level is None:
        return target.get(req.metric), target["name"]
    tenant = target["tenants"][req.level]
    phase, _, field = req.metric.partition("_")
    if phase in ("solo", "mixed"):
        return tenant[phase].get(field), f"{target['name']} @ {req.level}"
    return tenant.get(req.metric), f"{target['name']} @ {req.level}"


def evaluate(reqs: list[require.Requirement], doc: dict[str, Any]) -> list[require.Check]:
    checks = []
    for req in reqs:
        actual, where = measured(req, doc)
        passed = actual is not None and require.OPS[req.op](float(actual), req.threshold)
        checks.append(require.Check(req, None if actual is None else float(actual), passed, where))
    return checks


def _n(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:g}"


def console_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for t in doc["targets"]:
        served = ", ".join(
            f"{name} {s['mixed']['served_tokens']} tok ({_n(s['mixed']['token_throughput'])}/s, "
            f"fair {_n(s['fair_share_tokens_per_s'])}/s)"
            for name, s in t["tenants"].items()
        )
        lines.append(f"{t['name']}: mixed {served}; Jain {_n(t['jain'])} (raw {_n(t['jain_raw'])})")
        for name, s in t["tenants"].items():
            solo, mixed = s["solo"], s["mixed"]
            lines.append(
                f"  {name} TTFT p50 {_n(mixed['ttft_p50_ms'])} ms (solo {_n(solo['ttft_p50_ms'])}, "
                f"x{_n(s['ttft_p50_ratio'])}), p99 {_n(mixed['ttft_p99_ms'])} ms (solo "
                f"{_n(solo['ttft_p99_ms'])}, x{_n(s['ttft_p99_ratio'])})"
            )
        if t["failed"]:
            lines.append(f"  {t['failed']} requests failed on {t['name']}")
    lines.append(
        f"single tenant ({doc['targets'][0]['single_tenant']['tenant']} alone) against "
        f"{doc['baseline']}: "
        + ", ".join(
            f"{t['name']} throughput x{_n(t['solo_throughput_ratio'])}, TTFT p50 "
            f"x{_n(t['solo_ttft_p50_ratio'])}"
            for t in doc["targets"]
        )
    )
    return lines


def markdown(doc: dict[str, Any], checks: list[str]) -> str:
    rows, totals = [], []
    for t in doc["targets"]:
        for name, s in t["tenants"].items():
            solo, mixed = s["solo"], s["mixed"]
            rows.append(
                f"| {t['name']} | {name} | {mixed['completed']} | {mixed['failed']} "
                f"| {mixed['prompt_tokens']} | {mixed['output_tokens']} "
                f"| {_n(mixed['token_throughput'])} | {_n(s['fair_share_tokens_per_s'])} "
                f"| {_n(s['fair_ratio'])} | {_n(solo['ttft_p50_ms'])} / {_n(mixed['ttft_p50_ms'])} "
                f"| {_n(solo['ttft_p99_ms'])} / {_n(mixed['ttft_p99_ms'])} |"
            )
        totals.append(
            f"| {t['name']} | {t.get('from', 'this run')} | {_n(t['jain'])} | {_n(t['jain_raw'])} "
            f"| {_n(t['single_tenant']['token_throughput'])} | {_n(t['solo_throughput_ratio'])} "
            f"| {_n(t['solo_ttft_p50_ratio'])} |"
        )
    tenants = ", ".join(
        f"{t['name']} (c{t['concurrency']}, {t['input_len']} tok prompts"
        f"{', noisy' if t['noisy'] else ''})"
        for t in doc["tenants"]
    )
    return "\n".join(
        [
            f"# Tenants sharing a replica, {doc['date']}",
            "",
            f"Model {doc['model_id']}; tenants {tenants}; {doc['output_len']} output tokens; "
            f"{doc['phase_s']:g} s per phase (each tenant alone, then all together).",
            "",
            *(f"- {line}" for line in console_lines(doc) + checks),
            "",
            "| target | tenant | done | failed | prompt tok | output tok | tok/s | fair tok/s "
            "| tok/s / fair | TTFT p50 ms solo / mixed | TTFT p99 ms solo / mixed |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"| target | from | Jain | Jain raw | single tenant tok/s | vs {doc['baseline']} "
            "| TTFT p50 vs baseline |",
            "|---|---|---|---|---|---|---|",
            *totals,
            "",
            "Jain's index is over each tenant's mixed-phase tokens/s over its max-min fair share "
            "(demand capped at its solo tokens/s); Jain raw over the tokens/s themselves.",
            "",
        ]
    )


def report(
    meta: dict[str, Any],
    targets: list[dict[str, Any]],
    reqs: list[require.Requirement],
    files: dict[str, Any],
) -> Report:
    """`meta` holds date, model_id, tenants, output_len, phase_s, baseline; the first target is
    the subject of gates that name none."""
    doc = {**meta, "subject": targets[0]["name"]}
    doc["targets"] = with_baseline(targets, meta["baseline"])
    checks = evaluate(reqs, doc)
    doc["requirements"] = [
        {"expr": c.requirement.text, "measured": c.actual, "passed": c.passed, "where": c.where}
        for c in checks
    ]
    lines = [require.describe(c) for c in checks]
    passed = all(c.passed for c in checks)
    return Report(
        "tenants", doc, markdown(doc, lines), console_lines(doc) + lines, files=files, passed=passed
    )

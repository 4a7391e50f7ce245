"""The coldstart run's report: each phase's median and spread (min-max) over the runs, from zero to
the first token and to the end (result.json, summary.md, the table on the console)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from serving.engines.vllm_startup import FIRST_REQUEST_SERVED, SCHEDULED, STARTUP_PHASES
from serving.loadgen.report import Report
from serving.loadgen.scenarios.autoscale import Deployment
from serving.loadgen.scenarios.coldstart import ColdRun, ColdstartPlan

# Table rows in order: what the bench measures before the replica's process exists, the replica's
# phases, the client's own end-to-end figures.
ROWS = (
    "scale_up_decision",
    SCHEDULED,
    *STARTUP_PHASES,
    FIRST_REQUEST_SERVED,
    "from_zero_to_first_token",
    "from_zero_to_end",
)
ROW_LABELS = {
    "scale_up_decision": "request sent at zero -> Serve starts a replica",
    SCHEDULED: "Serve starts the replica -> its process exists",
    FIRST_REQUEST_SERVED: "replica's process (or Serve's start, if later) -> first token",
    "from_zero_to_first_token": "client: request sent at zero -> first token",
    "from_zero_to_end": "client: request sent at zero -> last token",
}


def run_figures(run: ColdRun) -> dict[str, float]:
    """One successful run's figures by row name (the phases it knows)."""
    figures = {"scale_up_decision": run.scale_up_decision_s, **run.phases}
    figures |= {"from_zero_to_first_token": run.ttft_s, "from_zero_to_end": run.e2e_s}
    return {name: float(value) for name, value in figures.items() if value is not None}


def spread(values: list[float]) -> dict[str, float | int]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "runs": len(values),
    }


def summarize(runs: list[ColdRun]) -> dict[str, dict[str, float | int]]:
    """Row -> median, min, max and how many runs measured it, over the runs that succeeded."""
    figures = [run_figures(run) for run in runs if run.status == "ok"]
    summary = {}
    for row in ROWS:
        values = [f[row] for f in figures if row in f]
        if values:
            summary[row] = spread(values)
    return summary


def table_lines(summary: dict[str, dict[str, float | int]]) -> list[str]:
    """A markdown table: phase, median, min-max, runs."""
    lines = ["| phase | median s | min-max s | runs |", "| --- | ---: | ---: | ---: |"]
    for row, figure in summary.items():
        label = f"{row} ({ROW_LABELS[row]})" if row in ROW_LABELS else row
        lines.append(
            f"| {label} | {figure['median']:.2f} | {figure['min']:.2f}-{figure['max']:.2f} "
            f"| {figure['runs']} |"
        )
    return lines


def build_document(
    plan: ColdstartPlan, deployment: Deployment, runs: list[ColdRun]
) -> dict[str, Any]:
    return {
        "target": {"name": plan.target.name, "base_url": plan.target.base_url},
        "dashboard": plan.dashboard_url,
        "model": plan.opts.model,
        "application": deployment.application,
        "deployment": deployment.name,
        "autoscaling_config": deployment.autoscaling_config,
        "runs_asked": plan.runs,
        "max_tokens": plan.max_tokens,
        "budget_s": plan.budget_s,
        "phases": summarize(runs),
        "runs": [asdict(run) for run in runs],
    }


def headline(document: dict[str, Any]) -> str:
    ok = sum(run["status"] == "ok" for run in document["runs"])
    first = document["phases"].get("from_zero_to_first_token")
    figure = "no run reached a first token"
    if first:
        figure = (
            f"from zero to first token median {first['median']:.2f} s "
            f"({first['min']:.2f}-{first['max']:.2f})"
        )
    return (
        f"coldstart {document['application']}/{document['deployment']} ({document['model']}): "
        f"{ok}/{document['runs_asked']} runs from zero served; {figure}"
    )


def failures(document: dict[str, Any]) -> list[str]:
    return [
        f"run {run['index']}: {run['status']} {run['error']}".rstrip()
        for run in document["runs"]
        if run["status"] != "ok"
    ]


def summary_markdown(document: dict[str, Any]) -> str:
    lines = [
        f"# Cold start: {document['application']}/{document['deployment']}",
        "",
        f"Model `{document['model']}` at `{document['target']['base_url']}`: one streaming chat "
        f"request of {document['max_tokens']} tokens sent at zero replicas, per run.",
        "",
        *table_lines(document["phases"]),
        "",
        headline(document),
    ]
    lines += [f"- {line}" for line in failures(document)]
    return "\n".join(lines) + "\n"


def report(plan: ColdstartPlan, deployment: Deployment, runs: list[ColdRun]) -> Report:
    document = build_document(plan, deployment, runs)
    console = [*table_lines(document["phases"]), headline(document), *failures(document)]
    passed = bool(runs) and all(run.status == "ok" for run in runs)
    return Report("coldstart", document, summary_markdown(document), console, passed=passed)

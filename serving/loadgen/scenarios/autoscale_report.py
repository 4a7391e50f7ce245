"""The autoscale run's report: result.json, summary.md and timeline.png (queue depth and replicas
over time, matplotlib headless like the sweep's plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from serving.engines.vllm_startup import FIRST_REQUEST_SERVED, STARTUP_PHASES
from serving.loadgen.report import Report
from serving.loadgen.scenarios.autoscale import AutoscalePlan, Run, request_counts
from serving.loadgen.scenarios.autoscale_timeline import figures

FIGURE_LABELS = {
    "scale_up_decision_s": "burst start -> scale-up decision (target 2 / replica STARTING)",
    "second_replica_serving_s": "burst start -> second replica RUNNING",
    "load_duration_s": "burst start -> last request answered",
    "scale_down_decision_s": "load end -> Serve's target back to 1",
    "back_to_one_s": "load end -> one replica left",
}


def build_document(plan: AutoscalePlan, run: Run) -> dict[str, Any]:
    dep = run.deployment
    return {
        "target": {"name": plan.target.name, "base_url": plan.target.base_url},
        "dashboard": plan.dashboard_url,
        "queue_source": getattr(plan.queue_source, "url", None),
        "model": plan.opts.model,
        "application": dep.application,
        "deployment": dep.name,
        "autoscaling_config": dep.autoscaling_config,
        "load": {
            "concurrency": plan.concurrency,
            "max_requests": len(plan.specs),
            "output_len": plan.specs[0].output_len if plan.specs else None,
            "max_load_s": plan.max_load_s,
            "hold_after_scale_up_s": plan.hold_s,
        },
        "figures": figures(run.replicas, run.load_end),
        "requests": request_counts(run.results),
        "replica_startup_s": run.startup_s,
        "other_deployments": other_deployments(run),
        "poll_errors": dict(run.poll_errors),
        "timeline": {
            "replicas_columns": ["t", "running", "starting", "stopping", "target"],
            "replicas": [
                [round(s.t, 2), s.running, s.starting, s.stopping, s.target] for s in run.replicas
            ],
            "queue_columns": ["t", "in_flight", "running", "waiting"],
            "queue": [[round(s.t, 2), s.in_flight, s.running, s.waiting] for s in run.queue],
        },
    }


def other_deployments(run: Run) -> dict[str, dict[str, int]]:
    """The most replicas each other autoscaling deployment ran or was asked for meanwhile: a
    burst on one model must leave the others as they were."""
    return {
        name: {
            "min_running": min(s.running for s in samples),
            "max_running": max(s.running for s in samples),
            "max_target": max(s.target for s in samples),
        }
        for name, samples in sorted(run.others.items())
        if samples
    }


def others_text(document: dict[str, Any]) -> str:
    others = document.get("other_deployments") or {}
    return "; ".join(
        f"{name} ran {o['min_running']}-{o['max_running']} replicas (target at most "
        f"{o['max_target']})"
        for name, o in others.items()
    )


def timeline_markers(fig: dict[str, float | None]) -> list[tuple[float, str]]:
    """(seconds since the burst started, label) of each event that happened; scale-down figures
    count from the load's end."""
    end = fig["load_duration_s"]
    events = [
        (fig["scale_up_decision_s"], "scale-up decided"),
        (fig["second_replica_serving_s"], "2nd replica serving"),
        (end, "load ended"),
        (
            None if end is None or fig["back_to_one_s"] is None else end + fig["back_to_one_s"],
            "one replica",
        ),
    ]
    return [(at, label) for at, label in events if at is not None]


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def console_summary(document: dict[str, Any]) -> str:
    fig, req = document["figures"], document["requests"]
    return (
        f"autoscale {document['application']}/{document['deployment']}: scale-up decided "
        f"{_seconds(fig['scale_up_decision_s'])}, second replica serving "
        f"{_seconds(fig['second_replica_serving_s'])} after the burst began; back to one "
        f"replica {_seconds(fig['back_to_one_s'])} after the load ended; "
        f"{req['completed']}/{req['sent']} completed, {req['refused_with_retry_after']} "
        f"refused with Retry-After, {req['failed']} failed"
        + (
            f"\nmeanwhile the other deployments: {others_text(document)}"
            if others_text(document)
            else ""
        )
    )


def summary_markdown(document: dict[str, Any]) -> str:
    lines = [
        f"# Autoscale: {document['application']}/{document['deployment']}",
        "",
        (
            f"Target `{document['target']['base_url']}`, model `{document['model']}`, step of "
            f"{document['load']['concurrency']} requests in flight."
        ),
        "",
        "| figure | seconds |",
        "| --- | --- |",
    ]
    lines += [f"| {FIGURE_LABELS[k]} | {_seconds(v)} |" for k, v in document["figures"].items()]
    req = document["requests"]
    lines += [
        "",
        "| requests | count |",
        "| --- | --- |",
        *(
            f"| {k} | {req[k]} |"
            for k in ("sent", "completed", "refused_with_retry_after", "failed")
        ),
    ]
    if req["failures"]:
        lines.append(f"\nFailures by kind: {req['failures']}")
    if others_text(document):
        lines.append(f"\nMeanwhile the other autoscaling deployments: {others_text(document)}.")
    for i, startup in enumerate(document["replica_startup_s"], 1):
        lines.append(f"\nReplica {i} start-up: {startup_text(startup)}")
    lines += ["", "![timeline](timeline.png)", ""]
    return "\n".join(lines)


def startup_text(startup: dict[str, float]) -> str:
    """A replica's named start-up phases in order (as `bench coldstart` and the metrics name
    them), then the engine's own finer timings."""
    named = (*STARTUP_PHASES, FIRST_REQUEST_SERVED)
    phases = ", ".join(f"{k} {startup[k]} s" for k in named if k in startup)
    details = ", ".join(f"{k} {v} s" for k, v in startup.items() if k not in named)
    return "; ".join(part for part in (phases, f"details: {details}" if details else "") if part)


def plot_timeline(document: dict[str, Any], path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    queue = document["timeline"]["queue"]
    if queue:
        ts, in_flight, running, waiting = zip(*queue)
        top.step(ts, in_flight, where="post", label="in flight (load generator)")
        top.step(ts, running, where="post", label="engine running (metrics)")
        top.step(ts, waiting, where="post", label="engine waiting = queue depth (metrics)")
    top.set_ylabel("requests")
    replicas = document["timeline"]["replicas"]
    if replicas:
        ts, running, starting, _, target = zip(*replicas)
        bottom.step(ts, running, where="post", label="RUNNING replicas")
        bottom.step(
            ts,
            [r + s for r, s in zip(running, starting)],
            where="post",
            linestyle="--",
            label="RUNNING + STARTING",
        )
        bottom.step(ts, target, where="post", linestyle=":", label="Serve's target")
    bottom.set_ylabel("replicas")
    bottom.set_ylim(bottom=0)
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("seconds since the burst started")
    for at, label in timeline_markers(document["figures"]):
        for ax in (top, bottom):
            ax.axvline(at, color="grey", linewidth=0.8, linestyle="-.")
        bottom.annotate(
            label, (at, 0.05), xycoords=("data", "axes fraction"), fontsize=7, rotation=90
        )
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Autoscaling {document['application']}/{document['deployment']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(plan: AutoscalePlan, run: Run) -> Report:
    document = build_document(plan, run)
    return Report(
        "autoscale",
        document,
        summary_markdown(document),
        [console_summary(document)],
        {"timeline.png": plot_timeline},
    )

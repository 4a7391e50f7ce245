"""Every report plot carries numbers on every axis: each is rendered from a small fixed result and
every axis must show at least two tick labels within its view (a log axis with one label, 10^3,
left TPOT, ITL and end-to-end unreadable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.axis import Axis
from matplotlib.figure import Figure

from serving.loadgen.scenarios import autoscale, autoscale_report, seed_report, soak
from serving.loadgen.scenarios import sweep_plots as plots
from tests.unit.loadgen.scenarios.test_autoscale import timeline
from tests.unit.loadgen.scenarios.test_seed import recorded_document
from tests.unit.loadgen.scenarios.test_soak import plan as soak_plan
from tests.unit.loadgen.scenarios.test_soak import run as soak_run

# (level, ttft, tpot, itl, e2el) medians in ms; p90 / p99 a little above. From a 2-target run where
# the baseline's TTFT grows with its queue while TPOT stays in a narrow band.
LEVELS = {
    "vllm": [
        ("c1", 316, 83.0, 82.0, 5600),
        ("c4", 1106, 99.9, 98.0, 7400),
        ("c16", 4185, 132.4, 130.0, 12500),
    ],
    "hf": [
        ("c1", 380, 81.4, 80.0, 5500),
        ("c4", 8753, 82.9, 82.0, 14000),
        ("c16", 32859, 61.3, 60.0, 36800),
    ],
}


def target_result(
    ttft: float, tpot: float, itl: float, e2el: float, tok_s: float
) -> dict[str, Any]:
    result: dict[str, Any] = {"output_throughput": tok_s, "request_throughput": tok_s / 64}
    for metric, value in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for stat, scale in (("median", 1.0), ("p90", 1.2), ("p99", 1.4)):
            result[f"{stat}_{metric}_ms"] = value * scale
    result["server"] = {"timeline": [(0.0, 1, 0), (1.5, 4, 2), (3.0, 2, 0), (4.0, 0, 0)]}
    return result


def bench_document() -> dict[str, Any]:
    levels = []
    for i, label in enumerate(("c1", "c4", "c16")):
        results = {
            name: target_result(*rows[i][1:], tok_s=10.0 * (i + 1) * (3 if name == "vllm" else 1))
            for name, rows in LEVELS.items()
        }
        levels.append({"label": label, "results": results})
    return {"model_id": "m", "targets": [{"name": "vllm"}, {"name": "hf"}], "levels": levels}


def visible_tick_labels(axis: Axis) -> list[str]:
    """Tick labels drawn within the axis's view: visible, not empty."""
    lo, hi = sorted(axis.get_view_interval())
    margin = (hi - lo) * 1e-9
    index = 0 if axis.axis_name == "x" else 1
    return [
        label.get_text()
        for label in axis.get_ticklabels(which="both")
        if label.get_visible()
        and label.get_text().strip()
        and lo - margin <= label.get_position()[index] <= hi + margin
    ]


def unreadable_axes(fig: Figure) -> list[str]:
    fig.canvas.draw()
    missing = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            siblings = (
                ax.get_shared_x_axes() if axis is ax.xaxis else ax.get_shared_y_axes()
            ).get_siblings(ax)
            shown = max(
                len(visible_tick_labels(getattr(a, axis.axis_name + "axis"))) for a in siblings
            )
            if shown < 2:
                missing.append(
                    f"{ax.get_title() or fig.get_suptitle()!r} {axis.axis_name}: "
                    f"{visible_tick_labels(axis)}"
                )
    return missing


@pytest.fixture()
def saved_figures(monkeypatch) -> list[Figure]:
    """Every figure a report saves, kept for inspection after the report closes it."""
    figures: list[Figure] = []
    real_savefig = Figure.savefig

    def savefig(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def autoscale_document() -> dict[str, Any]:
    plan = autoscale.AutoscalePlan(
        target=autoscale.Target("t", "http://127.0.0.1:1/autoscale/v1"),
        dashboard_url="http://127.0.0.1:2",
        queue_source=None,
        opts=autoscale.RequestOptions("m"),
        specs=[],
        concurrency=4,
    )
    queue = [autoscale.QueueSample(float(t), 4, min(4, t), max(0, 4 - t)) for t in range(0, 50, 5)]
    run = autoscale.Run(
        autoscale.Deployment("autoscale", "VLLMServer", {"max_replicas": 2}),
        results=[],
        replicas=timeline(),
        queue=queue,
        load_end=50.0,
    )
    return autoscale_report.build_document(plan, run)


REPORTS = {
    "throughput.png": lambda out: plots.plot_throughput(bench_document(), out),
    "latency.png": lambda out: plots.plot_latency(bench_document(), out),
    "server.png": lambda out: plots.plot_server(bench_document(), out),
    "seed.png": lambda out: seed_report.plot(recorded_document(), out),
    "timeline.png": lambda out: autoscale_report.plot_timeline(autoscale_document(), out),
    "memory.png": lambda out: soak.plot_memory(
        soak.soak_document(soak_plan(), soak_run(leak_mb_per_s=0.5)), out
    ),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_every_axis_shows_at_least_two_numbers(
    name: str, saved_figures: list[Figure], tmp_path: Path
) -> None:
    REPORTS[name](tmp_path / name)
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert len(saved_figures) == 1
    assert unreadable_axes(saved_figures[0]) == []

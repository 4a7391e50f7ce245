"""PNG plots of a bench run (matplotlib, headless): throughput vs load level, latency
percentiles vs load level, and what the server ran / queued over time at each level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

LATENCY_PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end-to-end"))
PERCENTILE_STYLES = (("median", "-"), ("p90", "--"), ("p99", ":"))
LOG_SCALE_SPREAD = 10  # a panel whose values span a decade or more gets a log axis


def _targets(document: dict[str, Any]) -> list[str]:
    return [t["name"] for t in document["targets"]]


def _series(document: dict[str, Any], target: str, key: str) -> list[float]:
    return [level["results"][target][key] for level in document["levels"]]


def _x_axis(ax: Any, document: dict[str, Any]) -> list[int]:
    labels = [level["label"] for level in document["levels"]]
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("load level (cN = N concurrent requests, rN = N requests/s)")
    ax.grid(alpha=0.3)
    return list(range(len(labels)))


def _number(value: float, _: object = None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _latency_axis(ax: Any, values: list[float]) -> None:
    """Log scale where targets differ by orders of magnitude (a queueing baseline's TTFT), with a
    labelled tick at 1, 2 and 5 of each decade so values can be read off; linear from 0 otherwise
    (a log axis over less than a decade showed a single label)."""
    positive = [v for v in values if v is not None and v > 0]
    if positive and max(positive) / min(positive) >= LOG_SCALE_SPREAD:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_number))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(_number))


def plot_throughput(document: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in (
        (axes[0], "output_throughput", "output tokens/s"),
        (axes[1], "request_throughput", "requests/s"),
    ):
        xs = _x_axis(ax, document)
        for target in _targets(document):
            ax.plot(xs, _series(document, target, key), marker="o", label=target)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(f"Throughput vs load ({document['model_id']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency(document: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (metric, title) in zip(axes.flat, LATENCY_PANELS):
        xs = _x_axis(ax, document)
        values = []
        for color, target in zip(colors, _targets(document)):
            for stat, style in PERCENTILE_STYLES:
                ys = _series(document, target, f"{stat}_{metric}_ms")
                ax.plot(xs, ys, style, color=color, marker=".", label=f"{target} {stat}")
                values += ys
        ax.set_title(f"{title} (ms)")
        _latency_axis(ax, values)
        ax.legend(fontsize=7)
    fig.suptitle("Latency percentiles vs load (solid median, dashed p90, dotted p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_server(document: dict[str, Any], path: Path) -> Path:
    levels = document["levels"]
    fig, axes = plt.subplots(len(levels), 1, figsize=(10, 2.4 * len(levels) + 0.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, level in zip(axes[:, 0], levels):
        for color, target in zip(colors, _targets(document)):
            timeline = level["results"][target]["server"]["timeline"]
            if not timeline:
                continue
            ts, running, waiting = zip(*timeline)
            ax.step(ts, running, where="post", color=color, label=f"{target} running")
            ax.step(
                ts, waiting, where="post", color=color, linestyle=":", label=f"{target} waiting"
            )
        ax.set_title(f"{level['label']}: requests the engine ran / queued", fontsize=9)
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds into the level (rounds back to back)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

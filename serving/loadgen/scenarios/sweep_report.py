"""The sweep's report: result.json (the whole run), runs/LEVEL-TARGET.json (one vLLM-style
result file each), summary.md, and PNG plots (throughput vs load, latency percentiles, the
server's running/waiting timeline)."""

from __future__ import annotations

from typing import Any

from serving.loadgen import metrics
from serving.loadgen.compare import BenchOutcome
from serving.loadgen.report import Plot, Report
from serving.loadgen.scenarios import sweep_plots

COLUMNS = (
    "level",
    "target",
    "done",
    "failed",
    "req/s",
    "out tok/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "ITL p50",
    "E2E p50",
    "max running",
    "batching",
    "cache hit",
)
RATIO_FIELDS = (
    ("output_throughput_ratio", "output throughput", "x{:.2f}"),
    ("request_throughput_ratio", "request throughput", "x{:.2f}"),
    ("median_ttft_ms_diff", "TTFT p50", "{:+.1f} ms"),
    ("median_tpot_ms_ratio", "TPOT p50", "x{:.2f}"),
)
HEADER_KEYS = ("date", "backend", "endpoint_type", "model_id", "arrivals")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _batching(server: dict[str, Any]) -> str:
    if server["batching"] is None:
        return "unknown"
    return "yes" if server["batching"] else "no"


def table_rows(document: dict[str, Any]) -> list[list[str]]:
    rows = []
    for level in document["levels"]:
        for name, r in level["results"].items():
            server = r["server"]
            rows.append(
                [
                    level["label"],
                    name,
                    str(r["completed"]),
                    str(r["failed"]),
                    f"{r['request_throughput']:.2f}",
                    f"{r['output_throughput']:.1f}",
                    _ms(r["median_ttft_ms"]),
                    _ms(r["p99_ttft_ms"]),
                    _ms(r["median_tpot_ms"]),
                    _ms(r["median_itl_ms"]),
                    _ms(r["median_e2el_ms"]),
                    "-" if server["max_running"] is None else str(server["max_running"]),
                    _batching(server),
                    _share(r.get("prefix_cache_hit_rate")),
                ]
            )
    return rows


def ratio_lines(document: dict[str, Any]) -> list[str]:
    subject = document["subject"]
    lines = []
    for level in document["levels"]:
        for other, ratios in level["ratios"].items():
            parts = [
                f"{label} " + (fmt.format(ratios[key]) if ratios.get(key) is not None else "n/a")
                for key, label, fmt in RATIO_FIELDS
            ]
            lines.append(f"{level['label']}: {subject} vs {other}: " + ", ".join(parts))
    return lines


MODEL_COLUMNS = (
    "level",
    "target",
    "model",
    "done",
    "failed",
    "out tok/s",
    "TTFT p50",
    "TPOT p50",
    "cache hit",
)
REPLICA_COLUMNS = ("level", "target", "replica", "models", "done", "TTFT p50", "cache hit")


def model_rows(document: dict[str, Any]) -> list[list[str]]:
    """`--model-mix`: one row per level, target and model."""
    rows = []
    for level in document["levels"]:
        for name, r in level["results"].items():
            for model, m in r.get("per_model", {}).items():
                rows.append(
                    [
                        level["label"],
                        name,
                        model,
                        str(m["completed"]),
                        str(m["failed"]),
                        f"{m['output_throughput']:.1f}",
                        _ms(m["median_ttft_ms"]),
                        _ms(m["median_tpot_ms"]),
                        _share(m.get("prefix_cache_hit_rate")),
                    ]
                )
    return rows


def replica_rows(document: dict[str, Any]) -> list[list[str]]:
    """One row per replica that answered (the platform names it on each response)."""
    rows = []
    for level in document["levels"]:
        for name, r in level["results"].items():
            for replica, m in r.get("per_replica", {}).items():
                rows.append(
                    [
                        level["label"],
                        name,
                        replica,
                        ",".join(m["models"]),
                        str(m["completed"]),
                        _ms(m["median_ttft_ms"]),
                        _share(m["prefix_cache_hit_rate"]),
                    ]
                )
    return rows


LOAD_COLUMNS = ("adapter", "model", "replica", "loads")


def load_rows(document: dict[str, Any]) -> list[list[str]]:
    """LoRA adapter loads per replica during the run (the local platform's counters)."""
    return [
        [row["adapter"], row["model"], row["replica"], str(row["loads"])]
        for row in document.get("adapter_loads") or []
    ]


def text_table(rows: list[list[str]], columns: tuple[str, ...] = COLUMNS) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [list(columns), *rows])


def markdown_table(rows: list[list[str]], columns: tuple[str, ...]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
    return head + "\n" + "\n".join("| " + " | ".join(row) + " |" for row in rows)


def shortfall_lines(document: dict[str, Any]) -> list[str]:
    """Failures by status, and requests the --duration cap kept from starting."""
    failures, cut = [], []
    for level in document["levels"]:
        for name, r in level["results"].items():
            if r["failures"]:
                failures.append(f"{level['label']} {name}: {r['failures']}")
            if r["not_started"]:
                cut.append(f"{level['label']} {name}: {r['not_started']}")
    lines = ["failures by status: " + "; ".join(failures)] if failures else []
    if cut:
        lines.append("not started (--duration cap): " + "; ".join(cut))
    return lines


def console_summary(document: dict[str, Any]) -> str:
    """The table the command prints: one row per level and target, then the ratios."""
    lines = [text_table(table_rows(document)), "(latencies in ms)"]
    if model_rows(document):
        lines += ["per model:", text_table(model_rows(document), MODEL_COLUMNS)]
    if len(replica_rows(document)) > 1:
        lines += ["per replica:", text_table(replica_rows(document), REPLICA_COLUMNS)]
    if load_rows(document):
        lines += [
            "adapter loads during the run (warm-up included):",
            text_table(load_rows(document), LOAD_COLUMNS),
        ]
    return "\n".join(lines + ratio_lines(document) + shortfall_lines(document))


def markdown(document: dict[str, Any], checks: list[str]) -> str:
    targets = "\n".join(f"- `{t['name']}`: {t['base_url']}" for t in document["targets"])
    parts = [
        f"# Benchmark {document['date']}",
        f"Model `{document['model_id']}`, arrivals `{document['arrivals']}`, endpoint "
        f"`{document['endpoint_type']}`, fixed output length: {document['fixed_output_length']}, "
        f"interleaved in up to {document['rounds']} rounds per level.",
        "Targets (the first is the subject of every ratio):\n" + targets,
        markdown_table(table_rows(document), COLUMNS),
        "Latencies in ms. `batching` = the engine reported more than one running request at once "
        "(polled from the server during the run; `unknown` when the server does not say or no poll "
        "caught a request running: lower --stats-interval for short levels).",
        *(
            ["## Per model\n" + markdown_table(model_rows(document), MODEL_COLUMNS)]
            if model_rows(document)
            else []
        ),
        *(
            ["## Per replica\n" + markdown_table(replica_rows(document), REPLICA_COLUMNS)]
            if replica_rows(document)
            else []
        ),
        *(
            [
                "## Adapter loads during the run\n"
                + markdown_table(load_rows(document), LOAD_COLUMNS)
                + "\n\nEach replica's `llm_serving_adapter_loads_total`, warm-up included."
            ]
            if load_rows(document)
            else []
        ),
        "`cache hit`: share of prompt tokens served from the prefix cache (the server's "
        "`usage.prompt_tokens_details.cached_tokens`; `-` when it does not report them).",
        "## Ratios\n" + "\n".join(f"- {line}" for line in ratio_lines(document)),
        *shortfall_lines(document),
    ]
    if checks:
        parts.append("## Requirements\n" + "\n".join(f"- {line}" for line in checks))
    parts.append(
        "Plots: `throughput.png`, `latency.png`, `server.png`; data: `result.json`, `runs/`."
    )
    return "\n\n".join(parts) + "\n"


def run_files(outcome: BenchOutcome) -> dict[str, dict[str, Any]]:
    """One vLLM `bench serve`-style file per (level, target): header, aggregates, raw lists."""
    document = outcome.document
    files = {}
    for level in document["levels"]:
        for name, summary in level["results"].items():
            run = outcome.runs[level["label"]][name]
            files[f"{level['label']}-{name}.json"] = {
                **{key: document[key] for key in HEADER_KEYS},
                "label": name,
                "base_url": next(t["base_url"] for t in document["targets"] if t["name"] == name),
                "request_rate": level["request_rate"] or "inf",
                "burstiness": level["burstiness"] or 1.0,
                "max_concurrency": level["concurrency"],
                **summary,
                **metrics.raw_fields(run.results),
            }
    return files


def report(outcome: BenchOutcome, checks: list[str], passed: bool) -> Report:
    document = outcome.document
    plots: dict[str, Plot] = {}
    if document["levels"]:  # a run cut before any level finished has nothing to plot
        plots = {
            "throughput.png": sweep_plots.plot_throughput,
            "latency.png": sweep_plots.plot_latency,
            "server.png": sweep_plots.plot_server,
        }
    return Report(
        "sweep",
        document,
        markdown(document, checks),
        [console_summary(document), *checks],
        plots,
        {f"runs/{name}": body for name, body in run_files(outcome).items()},
        passed,
    )

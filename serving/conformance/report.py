"""The feature x target table, as pure functions over case results: Markdown, JSON, and the
superset check (every case that passes on a base target passes on the others)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serving.conformance.context import Target
from serving.conformance.outcome import OK
from serving.conformance.runner import CaseResult


@dataclass(frozen=True)
class Regression:
    """A case that passes on the base target and not on `target`."""

    case: str
    target: str
    cell: str


def result_index(results: Sequence[CaseResult]) -> dict[tuple[str, str], CaseResult]:
    return {(result.case, result.target): result for result in results}


def case_names(results: Sequence[CaseResult]) -> list[str]:
    """Cases in the order they first appear."""
    return list(dict.fromkeys(result.case for result in results))


def matrix(results: Sequence[CaseResult], target_names: Sequence[str]) -> list[list[str]]:
    """One row per case: its name, then one cell per target ('-' where it did not run)."""
    index = result_index(results)
    return [
        [case, *(index[case, t].outcome.cell if (case, t) in index else "-" for t in target_names)]
        for case in case_names(results)
    ]


def markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(results: Sequence[CaseResult], target_names: Sequence[str]) -> str:
    header = ["feature", *target_names]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    for row in matrix(results, target_names):
        lines.append("| " + " | ".join(markdown_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def summary_line(results: Sequence[CaseResult], target_names: Sequence[str]) -> str:
    """`name: 30/32 ok` per target."""
    parts = []
    for name in target_names:
        mine = [result for result in results if result.target == name]
        passed = sum(result.outcome.status == OK for result in mine)
        parts.append(f"{name}: {passed}/{len(mine)} ok")
    return ", ".join(parts)


def to_json(
    results: Sequence[CaseResult], targets: Sequence[Target], models: dict[str, str]
) -> dict:
    return {
        "targets": [{"name": t.name, "url": t.url, "model": models.get(t.name)} for t in targets],
        "cases": case_names(results),
        "results": [
            {
                "case": r.case,
                "target": r.target,
                "status": r.outcome.status,
                "reason": r.outcome.reason,
                "seconds": round(r.seconds, 3),
            }
            for r in results
        ],
    }


def superset_regressions(results: Sequence[CaseResult], base: str) -> list[Regression]:
    """Cases ok on `base` that are anything but ok on another target (missing counts too)."""
    index = result_index(results)
    others = list(dict.fromkeys(r.target for r in results if r.target != base))
    regressions = []
    for case in case_names(results):
        base_result = index.get((case, base))
        if base_result is None or base_result.outcome.status != OK:
            continue
        for target in others:
            other = index.get((case, target))
            if other is None or other.outcome.status != OK:
                regressions.append(Regression(case, target, other.outcome.cell if other else "-"))
    return regressions

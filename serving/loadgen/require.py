"""`--require` gates: `[TARGET.]METRIC[@LEVEL] OP NUMBER`, e.g. `output_throughput_ratio>=3`,
`hf.output_throughput_ratio@c16>=3`, `vllm.max_running@c4>1`, `median_ttft_ms_diff<=10`.

- METRIC: any numeric result field (`output_throughput`, `p99_ttft_ms`, ...), a server field
  (`max_running`, `max_waiting`), or a comparison `<field>_ratio` / `<field>_diff` (subject/other,
  subject-other; the subject is the first target).
- TARGET: for a plain field, whose figure (default: the subject); for a comparison, the other
  target (default: the second target).
- LEVEL: a level label (`c16`, `r2`, `burst`; a bare number N means `cN`); default: the last
  (highest) level, where such claims are usually made.
Expressions are checked against the plan before the run, so a typo fails before minutes of load."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serving.loadgen import metrics, server_stats

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
PATTERN = re.compile(
    r"^\s*(?:(?P<target>[A-Za-z0-9_-]+)\.)?(?P<metric>[a-z0-9_]+)(?:@(?P<level>[A-Za-z0-9_.-]+))?"
    r"\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


class RequireError(ValueError):
    """An expression that does not parse or names something the run does not measure."""


@dataclass(frozen=True)
class Requirement:
    text: str
    metric: str
    op: str
    threshold: float
    target: str | None = None
    level: str | None = None

    @property
    def comparison(self) -> bool:
        return self.metric.endswith(("_ratio", "_diff"))


@dataclass(frozen=True)
class Check:
    requirement: Requirement
    actual: float | None
    passed: bool
    where: str  # "hf @ c16"


def split_expressions(items: tuple[str, ...] | list[str]) -> list[str]:
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def parse_requirement(text: str) -> Requirement:
    match = PATTERN.match(text)
    if not match:
        raise RequireError(
            f"bad --require {text!r}: expected [TARGET.]METRIC[@LEVEL] OP NUMBER, "
            "e.g. output_throughput_ratio>=3"
        )
    level = match["level"]
    if level and level.isdigit():
        level = f"c{level}"
    return Requirement(
        text.strip(), match["metric"], match["op"], float(match["value"]), match["target"], level
    )


def plain_metrics() -> set[str]:
    """Every numeric field a result carries (its own and its server summary's)."""
    result = metrics.summarize([], 1.0, {"ttft": 1.0})
    server = server_stats.summarize_samples(None, [server_stats.Sample(0, 0, 0)])
    return {
        key
        for part in (result, server)
        for key, value in part.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def _check_metric(req: Requirement) -> None:
    known = plain_metrics()
    base = req.metric.removesuffix("_ratio") if req.metric.endswith("_ratio") else req.metric
    if req.metric.endswith("_diff"):
        base = req.metric.removesuffix("_diff")
        if not base.endswith("_ms"):
            raise RequireError(f"bad --require {req.text!r}: _diff applies to *_ms fields only")
    if base not in known:
        raise RequireError(f"bad --require {req.text!r}: unknown metric {base!r}")


def validate(reqs: list[Requirement], targets: list[str], levels: list[str]) -> None:
    """Fail before the run for an unknown metric, target or level."""
    for req in reqs:
        _check_metric(req)
        if req.target is not None and req.target not in targets:
            raise RequireError(f"bad --require {req.text!r}: no target named {req.target!r}")
        if req.comparison and len(targets) < 2:
            raise RequireError(f"bad --require {req.text!r}: a ratio needs two targets")
        if req.comparison and req.target == targets[0]:
            raise RequireError(
                f"bad --require {req.text!r}: compare the subject with another target"
            )
        if req.level is not None and req.level not in levels:
            raise RequireError(f"bad --require {req.text!r}: no level {req.level!r} in {levels}")


def _level(document: dict[str, Any], label: str | None) -> dict[str, Any]:
    levels = document["levels"]
    return levels[-1] if label is None else next(lv for lv in levels if lv["label"] == label)


def measured(req: Requirement, document: dict[str, Any]) -> tuple[float | None, str]:
    """The figure an expression names, and where it was read."""
    level = _level(document, req.level)
    names = [t["name"] for t in document["targets"]]
    if req.comparison:
        other = req.target or names[1]
        return level["ratios"][other].get(req.metric), f"{names[0]} vs {other} @ {level['label']}"
    name = req.target or names[0]
    result = level["results"][name]
    value = result.get(req.metric, result["server"].get(req.metric))
    return value, f"{name} @ {level['label']}"


def evaluate(reqs: list[Requirement], document: dict[str, Any]) -> list[Check]:
    checks = []
    for req in reqs:
        actual, where = measured(req, document)
        passed = actual is not None and OPS[req.op](float(actual), req.threshold)
        checks.append(Check(req, None if actual is None else float(actual), passed, where))
    return checks


def describe(check: Check) -> str:
    actual = "not measured" if check.actual is None else f"{check.actual:.4g}"
    verdict = "ok  " if check.passed else "MISS"
    return f"{verdict} {check.requirement.text}  (measured {actual}, {check.where})"

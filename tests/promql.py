"""Metric names a PromQL expression or a Grafana dashboard queries: the tests check that the
dashboard and the alert rules name metrics the platform exports."""

from __future__ import annotations

import re
from typing import Any

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}
_PROMQL_NOISE = re.compile(
    r'"(?:[^"\\]|\\.)*"'  # string literals
    r"|\{[^}]*\}"  # label matchers
    r"|\[[^\]]*\]"  # range selectors
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"  # label lists
)
_PROMQL_NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*+)(?!\s*\()")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, labels left out)."""
    bare = _PROMQL_NOISE.sub(" ", expr)
    return {name for name in _PROMQL_NAME.findall(bare) if name.lower() not in PROMQL_WORDS}


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric the panels of a Grafana dashboard JSON query."""
    exprs = [
        target.get("expr", "")
        for panel in dashboard.get("panels", [])
        for target in panel.get("targets", [])
    ]
    return {name for expr in exprs for name in promql_metric_names(expr)}

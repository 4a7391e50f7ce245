"""The chart's `tracing` values: shorthands for platform.tracing (TracingConfig) that a cluster
operator sets without knowing the platform block (templates/_tracing.tpl renders the same map)."""

from __future__ import annotations

import copy
from typing import Any

from serving.config.tracing import TracingConfig

# Chart value -> TracingConfig field.
TRACING_KEYS = {
    "otlpEndpoint": "otlp_endpoint",
    "protocol": "protocol",
    "sampleRatio": "sample_ratio",
    "serviceName": "service_name",
}
# What a field's JSON schema keeps as the value's type (its title and default are the platform's).
_TYPE_KEYWORDS = ("type", "enum", "anyOf", "minimum", "maximum", "minLength")
NULL = {"type": "null"}


def tracing_values_schema() -> dict[str, Any]:
    """Each value typed as its TracingConfig field, or null (unset: the platform's default)."""
    fields = TracingConfig.model_json_schema()["properties"]
    properties = {}
    for value, key in TRACING_KEYS.items():
        typed = {k: v for k, v in fields[key].items() if k in _TYPE_KEYWORDS}
        choices = typed.get("anyOf", [typed])
        properties[value] = {"anyOf": [c for c in choices if c != NULL] + [NULL]}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def chart_tracing(values: dict[str, Any]) -> dict[str, Any]:
    """The platform.tracing keys the chart's values set (empty or null: not set)."""
    tracing = values.get("tracing") or {}
    return {
        key: tracing[value]
        for value, key in TRACING_KEYS.items()
        if tracing.get(value) is not None and tracing.get(value) != ""
    }


def served_platform(values: dict[str, Any]) -> dict[str, Any]:
    """The platform block the chart's apps are rendered from: platform, with tracing.* in its
    tracing section (the chart refuses a key set in both)."""
    platform = copy.deepcopy(values.get("platform") or {})
    if chart := chart_tracing(values):
        platform["tracing"] = {**(platform.get("tracing") or {}), **chart}
    return platform

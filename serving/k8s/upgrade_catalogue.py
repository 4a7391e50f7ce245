"""One change per chart value, classified: every leaf of values.yaml and every PlatformConfig
field under `platform` (also those values.yaml leaves out), each moved to another valid value.
The change is derived from the default and the values schema (bool flipped, number moved within
its bounds, another enum member, a quantity doubled); OVERRIDES hold the few a derivation cannot
make valid, CONTEXTS turn on the feature a value belongs to. upgrade_table turns the classified
catalogue into the README's table."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from typing import Any

import yaml

from serving.config import PlatformConfig, ServedModelConfig
from serving.k8s import CHART_DIR
from serving.k8s.chart import RenderError
from serving.k8s.upgrade_paths import Outcome, Values, classify, freeze, rendered_objects

Schema = dict[str, Any]
STRING: Schema = {"type": "string"}
QUANTITY = re.compile(r"(\d+(?:\.\d+)?)([a-zA-Z]*)")
# Values set on both sides of a change: monitors render only where their CRDs exist, which an
# offline render cannot look up.
BASE: Values = {"monitoring": {"skipCRDCheck": True}}
# The feature a value belongs to, on before and after: its value changes nothing while it is off.
CONTEXTS: dict[str, Values] = {
    "devicePlugin.*": {"devicePlugin": {"enabled": True}},
    "ingress.*": {"ingress": {"enabled": True}},
    # Shared by every worker pod: the chart refuses a claim one node mounts.
    "model.cache.persistentVolumeClaim.*": {
        "model": {
            "cache": {"persistentVolumeClaim": {"enabled": True, "accessModes": ["ReadWriteMany"]}}
        }
    },
    "monitoring.podMonitor.*": {"monitoring": {"podMonitor": {"enabled": True}}},
    "operator.*": {"operator": {"enabled": True}},
    "podDisruptionBudget.head.*": {"podDisruptionBudget": {"head": {"enabled": True}}},
    "ray.gcsFaultTolerance.*": {
        "ray": {"gcsFaultTolerance": {"enabled": True, "redisAddress": "redis:6379"}}
    },
    "ray.gcsFaultTolerance.redisPasswordSecret.key": {
        "ray": {"gcsFaultTolerance": {"redisPasswordSecret": {"name": "redis"}}}
    },
    "workers.gpu.enabled": {"platform": {"vllm": {"resources": {"accelerator": "cpu"}}}},
    "workers.cpu.enabled": {"platform": {"hf": {"enabled": False}, "analysis": {"enabled": False}}},
    "ray.incrementalUpgrade.*": {
        "ray": {
            "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
            "incrementalUpgrade": {"gatewayClassName": "istio"},
        }
    },
    "serviceAccount.*": {"serviceAccount": {"create": True}},
    "model.hfToken.key": {"model": {"hfToken": {"existingSecret": "hf-token"}}},
    "apiKeys.key": {"apiKeys": {"existingSecret": "api-keys"}},
    # A tenant's Secret needs the tenant.
    "tenantKeys": {"platform": {"auth": {"tenants": [{"name": "team-a"}]}}},
    # Without the bundled PostgreSQL and a URL, the chart refuses a store per pod unless accepted.
    "state.postgresql.enabled": {"state": {"allowUnshared": True}},
    "platform.state.url": {"state": {"postgresql": {"enabled": False}, "allowUnshared": True}},
    # Room for one more GPU replica, so that the chart's GPU check passes on both sides.
    "platform.*.resources.accelerator": {"workers": {"gpu": {"maxReplicas": 8}}},
}
TOLERATION = {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
# path glob -> the changed value, where the derived one is invalid (a list of objects, a value
# bound to another) or says nothing; the most specific glob wins.
OVERRIDES: dict[str, Any] = {
    "*.tolerations": [TOLERATION],
    "*.topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "imagePullSecrets": [{"name": "registry"}],
    "extraEnv": [{"name": "EXAMPLE", "value": "1"}],
    "extraVolumes": [{"name": "extra", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
    "ingress.tls": [{"hosts": ["llm.example.com"], "secretName": "tls"}],
    "networkPolicy.*From": [{"podSelector": {"matchLabels": {"app": "example"}}}],
    "networkPolicy.extraIngress": [{"from": [{"podSelector": {}}]}],
    "model.cache.persistentVolumeClaim.accessModes": ["ReadWriteMany", "ReadOnlyMany"],
    "platform.vllm.autoscaling.max_replicas": 3,  # 5 would need more GPUs than the group has
    "workers.*.minReplicas": 0,  # 2 would exceed replicas
    "ray.version": "2.61.0",
    "ray.upgradeStrategy": "None",  # the incremental upgrade needs a GatewayClass
    "platform.*.autoscaling": {"min_replicas": 1, "max_replicas": 2},
    "platform.vllm.adapters": [{"name": "demo", "path": "demo:demo"}],
    "platform.vllm.autoscaling": None,  # off: a fixed num_replicas
    "platform.analysis.auth": {"api_keys_env": "ANALYSIS_KEYS"},
    "platform.auth.tenants": [{"name": "team-a", "api_keys_env": "TEAM_A_KEYS"}],
    "tenantKeys": {"team-a": {"existingSecret": "team-a-keys"}},
    "platform.state.url": "postgresql+psycopg://llm@db.example.com:5432/llm",
    "platform.tracing.otlp_endpoint": "http://collector.example.com:4318/v1/traces",
    "tracing.otlpEndpoint": "http://collector.example.com:4318/v1/traces",  # the chart wants a URL
    "state.postgresql.database": "llm_serving_2",  # an identifier: no '-'
    "state.postgresql.user": "llm_serving_2",
    "state.postgresql.persistence.accessModes": ["ReadWriteOncePod"],
}
# Subtrees changed as a whole (their OVERRIDES give the value), beside their leaves.
SUBTREES = ("platform.vllm.autoscaling",)
# path -> the values the after side merges in, where one value cannot say the change.
PATCHES: dict[str, Callable[[], Values]] = {
    # From one model to two behind the router (the chart's multi-model example).
    "platform.models": lambda: yaml.safe_load(
        (CHART_DIR / "ci" / "multi-model-values.yaml").read_text()
    ),
}
# path -> why its change is not classified (it cannot render offline, or renders only errors).
NOT_RENDERED: dict[str, str] = {
    "platform.auth.api_keys": "refused by the chart: keys would be readable in `serveConfigV2`",
}


@dataclass(frozen=True)
class Change:
    path: str  # dotted value path, e.g. platform.vllm.engine.max_num_seqs
    before: str  # user values, JSON (hashable)
    after: str


@dataclass(frozen=True)
class Classified:
    path: str
    outcome: Outcome | None
    reason: str = ""  # why outcome is None


def resolve(schema: Schema, defs: dict[str, Schema]) -> Schema:
    """Follow `$ref`, and prefer an object (or the non-null) option of `anyOf`."""
    if "$ref" in schema:
        schema = {**defs[schema["$ref"].rsplit("/", 1)[-1]], **schema}
        schema.pop("$ref")
    options = [o for o in schema.get("anyOf", []) if o.get("type") != "null"]
    return resolve(options[0], defs) if options else schema


def values_schema() -> Schema:
    """The schema Helm validates the values with (its `platform` part is PlatformConfig's)."""
    schema: Schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema


def defaults() -> Values:
    """values.yaml with the platform's fields it leaves out (PlatformConfig's defaults)."""
    chart_values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    platform = _merged(PlatformConfig().model_dump(mode="json"), chart_values["platform"])
    return {**chart_values, "platform": platform}


def _merged(base: Values, top: Values) -> Values:
    merged = dict(base)
    for key, value in top.items():
        under = merged.get(key)
        if isinstance(value, dict) and isinstance(under, dict):
            merged[key] = _merged(under, value)
        else:
            merged[key] = value
    return merged


Leaf = tuple[str, Any, Schema]


def leaves(value: Any, schema: Schema, defs: dict[str, Schema], path: str) -> Iterator[Leaf]:
    """(path, default, schema) of every leaf: a scalar, a list, an empty or unset object."""
    schema = resolve(schema, defs)
    if not isinstance(value, dict) or not value:
        yield path, value, schema
        return
    properties = schema.get("properties") or {}
    for key in [k for k in {**value, **properties} if k != "global"]:  # global: Helm's own
        child = properties.get(key) or _extra(schema)
        yield from leaves(value.get(key), child, defs, f"{path}.{key}" if path else key)


def _extra(schema: Schema) -> Schema:
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def changed_value(path: str, value: Any, schema: Schema) -> Any:
    """Another valid value: an override, else one derived from the default and the schema."""
    for glob in sorted(OVERRIDES, key=len, reverse=True):  # the most specific glob first
        if fnmatch(path, glob):
            return OVERRIDES[glob]
    others = [v for v in schema.get("enum", []) if v != value]
    if others:
        return others[0]
    if value is None:  # unset: start from the zero of its type
        zeros = {"integer": 0, "number": 0.0, "string": "", "boolean": False}
        if schema.get("type") not in zeros:
            raise ValueError(
                f"{path}: no derived change for an unset {schema.get('type')}: add it to OVERRIDES"
            )
        value = zeros[schema["type"]]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return _moved_number(value, schema)
    if isinstance(value, str):
        return _other_string(value)
    if isinstance(value, dict):  # an empty map: one entry of the type its values have
        return {"example.com/key": changed_value(path + ".*", None, _extra(schema) or STRING)}
    return value[:-1] if value else ["example"]


def _moved_number(value: float, schema: Schema) -> float:
    step = 1 if isinstance(value, int) else (value / 2 or 0.5)
    low, high = schema.get("minimum", float("-inf")), schema.get("maximum", float("inf"))
    return value + step if value + step <= high else max(low, value - step)


def _other_string(value: str) -> str:
    """A quantity or number doubled (`4Gi` -> `8Gi`, `0` -> `1`), other text extended."""
    match = QUANTITY.fullmatch(value)
    if match:
        number, unit = match.groups()
        doubled = float(number) * 2 or 1
        return f"{doubled:g}{unit}"
    return f"{value}-2" if value else "example"


def nested(path: str, value: Any) -> Values:
    result: Values = {}
    node = result
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return result


def context(path: str) -> Values:
    """What the contexts whose glob matches the path set."""
    values: Values = {}
    for glob, setting in CONTEXTS.items():
        if fnmatch(path, glob):
            values = _merged(values, setting)
    return values


def value_at(values: Values, path: str, default: Any) -> Any:
    node: Any = values
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def change(path: str, default: Any, schema: Schema) -> Change:
    """Both sides set BASE and the path's context; the after side moves the value from what the
    context (or else the chart) sets, or merges the path's patch."""
    before = _merged(BASE, context(path))
    if path in PATCHES:
        after = _merged(before, PATCHES[path]())
    else:
        value = value_at(context(path), path, default)
        after = _merged(before, nested(path, changed_value(path, value, schema)))
    return Change(path, json.dumps(before), json.dumps(after))


def catalogue() -> list[Change]:
    """One change per value, in values.yaml's order (PlatformConfig's for fields it leaves out),
    then the subtrees changed as a whole, then the fields of a `platform.models[]` entry."""
    schema = values_schema()
    defs = schema.get("$defs", {})
    changes = [change(*leaf) for leaf in leaves(defaults(), schema, defs, "")]
    changes += [change(path, None, {}) for path in SUBTREES]
    return changes + model_changes(schema, defs)


def model_changes(schema: Schema, defs: dict[str, Schema]) -> list[Change]:
    """The first model's fields, each changed inside the chart's multi-model example. Helm
    replaces a list whole, so each after side is the example's list with that model changed."""
    before = _merged(BASE, PATCHES["platform.models"]())
    first, *rest = before["platform"]["models"]
    fields = _merged(ServedModelConfig.model_validate(first).model_dump(mode="json"), first)
    item = schema["properties"]["platform"]["properties"]["models"]["items"]
    changes = []
    for field, value, field_schema in leaves(fields, item, defs, ""):
        path = f"platform.models[].{field}"
        model = _merged(first, nested(field, changed_value(path, value, field_schema)))
        after = _merged(before, {"platform": {"models": [model, *rest]}})
        changes.append(Change(path, json.dumps(before), json.dumps(after)))
    return changes


def classified(change: Change) -> Classified:
    if change.path in NOT_RENDERED:
        return Classified(change.path, None, NOT_RENDERED[change.path])
    before, after = json.loads(change.before), json.loads(change.after)
    try:
        outcome = classify(before, after)
    except RenderError as err:
        return Classified(change.path, None, f"does not render: {str(err).splitlines()[-1]}")
    if change.path.startswith("platform.models[]."):
        outcome = generic_model_apps(outcome, before["platform"]["models"][0]["name"])
    return Classified(change.path, outcome)


def generic_model_apps(outcome: Outcome, name: str) -> Outcome:
    """With `platform.models` the app `vllm` is the router and each model has its own app
    (`vllm-<name>`): say so, not the example's names (a changed name gets `-2` appended)."""
    renamed = (
        app.replace(f"vllm-{name}", "vllm-<name>").replace("vllm-<name>-2", "vllm-<renamed>")
        for app in outcome.apps
    )
    return replace(outcome, apps=tuple(a if a != "vllm" else "vllm (router)" for a in renamed))


def classified_catalogue() -> list[Classified]:
    """Every change of the catalogue, classified. Raises RenderError when the chart's defaults do
    not render (a table of errors says nothing)."""
    rendered_objects(freeze(BASE))
    return [classified(change) for change in catalogue()]

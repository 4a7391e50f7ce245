"""The chart's own values (everything but `platform`) as JSON schema, and the `# --` comments of
values.yaml, which document each value once: helm-docs reads them, and so does this schema."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from serving.config import PlatformConfig
from serving.k8s import CHART_DIR
from serving.k8s.tracing_values import tracing_values_schema

Schema = dict[str, Any]
SCHEMA_DRAFT = "https://json-schema.org/draft/2020-12/schema"
# KubeRay's RayService spec.upgradeStrategy.type: the chart's ray.upgradeStrategy and the
# LLMService's upgradeStrategy accept these.
UpgradeStrategy = Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"]
# KubeRay's authOptions.mode (Ray's token authentication): the chart's ray.auth.mode and the
# LLMService's rayAuth accept these.
RayAuthMode = Literal["token", "disabled"]

# A mapping key at any indentation; list items ("- key: ...") are not keys of the parent map.
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+):(?P<rest>.*)$")
DOC_MARK = "# --"


@dataclass(frozen=True)
class ValueLine:
    path: str
    doc: str | None  # the `# --` comment above the key, None when there is none
    leaf: bool  # the value sits on the key's line (a scalar, `{}`, `[]`, a flow map)


def value_lines(text: str) -> list[ValueLine]:
    """Every key of a values.yaml with its dotted path and its `# --` comment."""
    lines: list[ValueLine] = []
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = KEY_LINE.match(raw)
        if not match:  # blank line, list item or continuation: ends a comment block
            comments = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([key for _, key in stack] + [match["key"]])
        leaf = bool(match["rest"].split("#")[0].strip())
        lines.append(ValueLine(path, doc_text(comments), leaf))
        stack.append((indent, match["key"]))
        comments = []
    return lines


def doc_text(comments: list[str]) -> str | None:
    """`# -- first line` plus its `# ` continuation lines, joined; None without a `# --`."""
    for start, line in enumerate(comments):
        if line.startswith(DOC_MARK):
            parts = [line[len(DOC_MARK) :].strip()]
            parts += [c.lstrip("#").strip() for c in comments[start + 1 :]]
            return " ".join(part for part in parts if part)
    return None


def value_comments(text: str) -> dict[str, str]:
    return {line.path: line.doc for line in value_lines(text) if line.doc}


def undocumented_values(text: str) -> list[str]:
    """Leaf values with no `# --` comment on themselves or on an enclosing key."""
    documented = set(value_comments(text))

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1))

    return [line.path for line in value_lines(text) if line.leaf and not covered(line.path)]


# Schema builders. Objects are closed (a typo in a key fails the install) unless they are
# Kubernetes objects passed through to a pod spec, which the API server checks itself.
K8S_OBJECT: Schema = {"type": "object"}
K8S_LIST: Schema = {"type": "array", "items": {"type": "object"}}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
PULL_POLICY: Schema = {"enum": ["Always", "IfNotPresent", "Never"]}
SERVICE_TYPE: Schema = {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}


def closed(properties: dict[str, Schema]) -> Schema:
    return {"type": "object", "additionalProperties": False, "properties": properties}


def string(**extra: Any) -> Schema:
    return {"type": "string", **extra}


def integer(minimum: int | None = None) -> Schema:
    return {"type": "integer"} if minimum is None else {"type": "integer", "minimum": minimum}


BOOL: Schema = {"type": "boolean"}


def percent() -> Schema:
    return {"type": "integer", "minimum": 1, "maximum": 100}


def pod_placement() -> dict[str, Schema]:
    return {
        "nodeSelector": STRING_MAP,
        "tolerations": K8S_LIST,
        "affinity": K8S_OBJECT,
        "podLabels": STRING_MAP,
        "podAnnotations": STRING_MAP,
        "priorityClassName": string(),
        "topologySpreadConstraints": K8S_LIST,
    }


def worker_group(gpu: bool) -> Schema:
    properties = {
        "enabled": BOOL,
        "groupName": string(pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        "replicas": integer(0),
        "minReplicas": integer(0),
        "maxReplicas": integer(1),
        "rayStartParams": STRING_MAP,
        "resources": K8S_OBJECT,
        "runtimeClassName": string(),
        **pod_placement(),
    }
    if gpu:
        # No minimum here: the chart's validation explains why 0 is wrong and what to do instead.
        properties["gpusPerWorker"] = integer()
        # null: derived from the GPU apps' min_replicas (templates/_helpers.tpl workerMinReplicas).
        properties["minReplicas"] = {"anyOf": [integer(0), {"type": "null"}]}
    return closed(properties)


def probe() -> Schema:
    return closed(
        {
            "periodSeconds": integer(1),
            "timeoutSeconds": integer(1),
            "failureThreshold": integer(1),
            "initialDelaySeconds": integer(0),
        }
    )


def monitor() -> Schema:
    return closed({"enabled": BOOL, "interval": string(), "labels": STRING_MAP})


def model_values() -> Schema:
    pvc = closed(
        {
            "enabled": BOOL,
            "existingClaim": string(),
            "storageClassName": string(),
            "accessModes": {"type": "array", "items": string(), "minItems": 1},
            "size": string(),
        }
    )
    return closed(
        {
            "hfToken": closed(
                {"existingSecret": string(), "key": string(minLength=1), "value": string()}
            ),
            "prefetch": closed({"enabled": BOOL, "resources": K8S_OBJECT}),
            "cache": closed(
                {
                    "mountPath": string(pattern="^/"),
                    "emptyDirSizeLimit": string(),
                    "persistentVolumeClaim": pvc,
                }
            ),
        }
    )


def state_values() -> Schema:
    """The store's server: the bundled PostgreSQL or the Secret of an existing one."""
    persistence = closed(
        {
            "enabled": BOOL,
            "storageClassName": string(),
            "accessModes": {"type": "array", "items": string(), "minItems": 1},
            "size": string(minLength=1),
        }
    )
    # PostgreSQL identifiers the chart writes unquoted into its URL and the image's env.
    identifier = string(pattern="^[a-z_][a-z0-9_]{0,62}$")
    postgresql = closed(
        {
            "enabled": BOOL,
            "image": closed(
                {
                    "repository": string(minLength=1),
                    "tag": string(minLength=1),
                    "pullPolicy": PULL_POLICY,
                }
            ),
            "database": identifier,
            "user": identifier,
            "maxConnections": integer(10),
            "persistence": persistence,
            "resources": K8S_OBJECT,
            "nodeSelector": STRING_MAP,
            "tolerations": K8S_LIST,
            "affinity": K8S_OBJECT,
        }
    )
    return closed(
        {
            "existingSecret": string(),
            "secretKey": string(minLength=1),
            "allowUnshared": BOOL,
            "postgresql": postgresql,
        }
    )


def chart_values() -> dict[str, Schema]:
    return {
        "global": K8S_OBJECT,  # Helm hands subcharts a `global` map
        "nameOverride": string(),
        "fullnameOverride": string(),
        "commonLabels": STRING_MAP,
        "image": closed(
            {"repository": string(minLength=1), "tag": string(), "pullPolicy": PULL_POLICY}
        ),
        "imagePullSecrets": K8S_LIST,
        "serviceAccount": closed({"create": BOOL, "name": string(), "annotations": STRING_MAP}),
        "extraEnv": K8S_LIST,
        "extraVolumes": K8S_LIST,
        "extraVolumeMounts": K8S_LIST,
        "kuberay": closed({"checkOperator": BOOL}),
        "ray": closed(
            {
                "version": string(pattern=r"^(\d+\.\d+\.\d+)?$"),
                "upgradeStrategy": {"enum": list(get_args(UpgradeStrategy))},
                "incrementalUpgrade": closed(
                    {
                        "gatewayClassName": string(),
                        "stepSizePercent": percent(),
                        "intervalSeconds": integer(1),
                        "maxSurgePercent": percent(),
                    }
                ),
                "auth": closed(
                    {"mode": {"enum": list(get_args(RayAuthMode))}, "secretName": string()}
                ),
                "gcsFaultTolerance": closed(
                    {
                        "enabled": BOOL,
                        "redisAddress": string(),
                        "redisPasswordSecret": closed(
                            {"name": string(), "key": string(minLength=1)}
                        ),
                    }
                ),
            }
        ),
        "autoscaler": closed(
            {
                "enabled": BOOL,
                "upscalingMode": {"enum": ["Default", "Conservative", "Aggressive"]},
                "idleTimeoutSeconds": integer(0),
                "resources": K8S_OBJECT,
            }
        ),
        "head": closed({"rayStartParams": STRING_MAP, "resources": K8S_OBJECT, **pod_placement()}),
        "workers": closed({"gpu": worker_group(gpu=True), "cpu": worker_group(gpu=False)}),
        "model": model_values(),
        "apiKeys": closed(
            {"existingSecret": string(), "key": string(minLength=1), "value": string()}
        ),
        # Tenant -> its keys' Secret; the chart's validation refuses a name no tenant has.
        "tenantKeys": {
            "type": "object",
            "additionalProperties": closed(
                {"existingSecret": string(minLength=1), "key": string(minLength=1)}
            )
            | {"required": ["existingSecret"]},
        },
        "state": state_values(),
        "networkPolicy": closed(
            {
                "enabled": BOOL,
                "servingFrom": K8S_LIST,
                "metricsFrom": K8S_LIST,
                "kuberayFrom": K8S_LIST,
                "extraIngress": K8S_LIST,
            }
        ),
        "tracing": tracing_values_schema(),
        "probes": closed({"startup": probe(), "liveness": probe(), "readiness": probe()}),
        "podSecurityContext": K8S_OBJECT,
        "containerSecurityContext": K8S_OBJECT,
        "services": closed(
            {
                "api": closed({"type": SERVICE_TYPE, "annotations": STRING_MAP}),
                "dashboard": closed({"enabled": BOOL, "type": SERVICE_TYPE}),
                "metrics": closed({"enabled": BOOL}),
            }
        ),
        "ingress": closed(
            {
                "enabled": BOOL,
                "className": string(),
                "annotations": STRING_MAP,
                "host": string(),
                "tls": K8S_LIST,
            }
        ),
        "monitoring": closed(
            {
                "skipCRDCheck": BOOL,
                "serviceMonitor": monitor(),
                "podMonitor": monitor(),
                "grafanaDashboard": closed(
                    {"enabled": BOOL, "labels": STRING_MAP, "annotations": STRING_MAP}
                ),
            }
        ),
        "devicePlugin": closed(
            {
                "enabled": BOOL,
                "image": closed(
                    {
                        "repository": string(minLength=1),
                        "tag": string(minLength=1),
                        "pullPolicy": PULL_POLICY,
                    }
                ),
                "runtimeClassName": string(),
                "priorityClassName": string(),
                "nodeSelector": STRING_MAP,
                "tolerations": K8S_LIST,
                "resources": K8S_OBJECT,
            }
        ),
        "podDisruptionBudget": closed(
            {
                "workers": closed({"enabled": BOOL}),
                "head": closed({"enabled": BOOL}),
            }
        ),
        "operator": closed(
            {"enabled": BOOL, "syncIntervalSeconds": integer(1), "resources": K8S_OBJECT}
        ),
        "helmTest": closed({"enabled": BOOL}),
    }


def describe(schema: Schema, path: str, docs: dict[str, str]) -> Schema:
    """Copy `schema`, adding values.yaml's comment as the description of each documented key."""
    result = dict(schema)
    if path in docs:
        result["description"] = docs[path]
    if "properties" in schema:
        result["properties"] = {
            key: describe(sub, f"{path}.{key}", docs) for key, sub in schema["properties"].items()
        }
    return result


def chart_properties(docs: dict[str, str]) -> dict[str, Schema]:
    return {key: describe(schema, key, docs) for key, schema in chart_values().items()}


def platform_schema() -> dict[str, Any]:
    return PlatformConfig.model_json_schema()


def values_schema(values_yaml: str | None = None) -> dict[str, Any]:
    """The chart's values.schema.json. Descriptions of chart values come from values.yaml's
    `# --` comments; the platform part (with its $defs hoisted to the root, where its $refs
    point) from PlatformConfig."""
    if values_yaml is None:
        values_yaml = (CHART_DIR / "values.yaml").read_text()
    platform = platform_schema()
    defs = platform.pop("$defs", {})
    platform["description"] = value_comments(values_yaml).get("platform") or platform.get(
        "description", ""
    )
    properties = chart_properties(value_comments(values_yaml)) | {"platform": platform}
    return {
        "$schema": SCHEMA_DRAFT,
        "title": "llm-serving chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "$defs": defs,
    }

"""What the cluster runs, derived from PlatformConfig with pure functions (no cluster, no Helm).

`serve_config_v2` is the RayService's serveConfigV2 (Ray Serve's ServeDeploySchema): the chart
renders the same document from `.Values.platform`, and a test holds the two equal.
`values_schema` is the chart's values.schema.json: the `platform` part is PlatformConfig's own
JSON schema, so the chart rejects exactly what the platform would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.config import PlatformConfig
from serving.k8s_schema import chart_properties, value_comments

APP_NAMES = ("vllm", "hf", "analysis")  # serving.app.build_apps order
SERVE_HOST = "0.0.0.0"  # in a pod the proxy must listen beyond loopback, whatever http.host says
REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = REPO_ROOT / "helm" / "llm-serving"
SCHEMA_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def app_builders() -> dict[str, Callable[..., Any]]:
    """The Serve application builders a RayService names, by app name."""
    from serving import app

    return {"vllm": app.vllm_app, "hf": app.hf_app, "analysis": app.analysis_app}


def import_path(builder: Callable[..., Any]) -> str:
    return f"{builder.__module__}:{builder.__qualname__}"


def platform_args(config: PlatformConfig) -> dict[str, Any]:
    """The platform block as the user wrote it (only set fields): the chart passes its values
    through unchanged, and every app fills in the same defaults when it loads them."""
    return config.model_dump(mode="json", exclude_unset=True)


def serve_applications(config: PlatformConfig) -> list[dict[str, Any]]:
    builders = app_builders()
    apps = []
    for name in APP_NAMES:
        settings = getattr(config, name)
        if settings.enabled:
            apps.append(
                {
                    "name": name,
                    "import_path": import_path(builders[name]),
                    "route_prefix": settings.route_prefix,
                    "args": platform_args(config),  # a copy per app: no YAML anchors
                }
            )
    return apps


def serve_config_v2(config: PlatformConfig) -> dict[str, Any]:
    """serveConfigV2 of the RayService, checked against Ray Serve's own schema."""
    document = {
        "proxy_location": "EveryNode",
        "http_options": {"host": SERVE_HOST, "port": config.http.port},
        "applications": serve_applications(config),
    }
    validate_serve_config(document)
    return document


def validate_serve_config(document: dict[str, Any]) -> None:
    """Raise pydantic's ValidationError when Ray Serve would reject the document."""
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(document)


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

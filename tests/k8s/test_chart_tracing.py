"""Tracing on a cluster (issue 38): the chart's `tracing` values fill platform.tracing in the args
of every app that reads it (the serve config equals serving.k8s.serve_config_v2's of that platform),
platform.tracing alone still works, a key set both ways or a non-URL endpoint is refused, and the
examples of docs/guide/tracing.md's "On a cluster" render."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from serving.config import PlatformConfig
from serving.config.apps import apps_of
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render
from serving.k8s.serve_config import serve_config_v2
from serving.k8s.tracing_values import TRACING_KEYS, served_platform
from tests.k8s.conftest import chart_platform, repo_path, values_of

Doc = dict[str, Any]
ENDPOINT = "http://otel-collector.observability.svc:4317"
TRACING = {"otlpEndpoint": ENDPOINT, "protocol": "grpc", "sampleRatio": 0.1}
EXPECTED = {"otlp_endpoint": ENDPOINT, "protocol": "grpc", "sample_ratio": 0.1}
GUIDE = repo_path("docs", "guide", "tracing.md")


def render(values: dict[str, Any]) -> tuple[list[Doc], dict[str, Any]]:
    docs = [k8s_render.masked_password(doc) for doc in k8s_render.render_documents(values)]
    return docs, k8s_render.merged_values(values)


def rayservice(docs: list[Doc]) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == "RayService"]
    return doc


def serve_apps(docs: list[Doc]) -> dict[str, Doc]:
    config = yaml.safe_load(rayservice(docs)["spec"]["serveConfigV2"])
    return {app["name"]: app for app in config["applications"]}


def traced_apps(platform: PlatformConfig) -> set[str]:
    """The serve apps that read platform.tracing: the registry's traced apps that are enabled,
    and with `models` the router in the vllm app's place and every model's app."""
    names = {
        app.name for app in apps_of(platform) if app.traced and getattr(platform, app.name).enabled
    }
    if platform.models and "vllm" in names:
        names |= {entry.app_name for entry in platform.models}
    return names


def expected_platform(docs: list[Doc], merged: dict[str, Any]) -> PlatformConfig:
    return PlatformConfig.model_validate(
        chart_platform(docs, {**merged, "platform": served_platform(merged)})
    )


def with_tracing(values: dict[str, Any], tracing: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(values), "tracing": tracing}


@pytest.mark.parametrize("case", ["default", "multi-model"])
def test_tracing_values_reach_every_app_that_reads_them(case: str) -> None:
    docs, merged = render(with_tracing(values_of(case), TRACING))
    platform = expected_platform(docs, merged)
    assert yaml.safe_load(rayservice(docs)["spec"]["serveConfigV2"]) == serve_config_v2(platform)
    apps, traced = serve_apps(docs), traced_apps(platform)
    assert traced and traced <= set(apps), (traced, set(apps))
    for name, app in apps.items():
        assert app["args"].get("tracing") == (EXPECTED if name in traced else None), name


def test_platform_tracing_alone_still_works() -> None:
    docs, _ = render({"platform": {"tracing": {"otlp_endpoint": ENDPOINT, "protocol": "grpc"}}})
    assert serve_apps(docs)["vllm"]["args"]["tracing"] == {
        "otlp_endpoint": ENDPOINT,
        "protocol": "grpc",
    }


def test_tracing_off_by_default_leaves_the_args_without_it() -> None:
    docs, _ = render({})
    assert all("tracing" not in app["args"] for app in serve_apps(docs).values())


def test_turning_tracing_on_changes_the_serve_config_only() -> None:
    """Serve rolls the traced apps' replicas; the RayCluster (pods, env) stays, no new cluster."""
    off, on = render({})[0], render({"tracing": TRACING})[0]
    assert rayservice(on)["spec"]["rayClusterConfig"] == rayservice(off)["spec"]["rayClusterConfig"]
    assert [d for d in on if d["kind"] != "RayService"] == [
        d for d in off if d["kind"] != "RayService"
    ]


def test_the_network_policy_leaves_the_collector_reachable() -> None:
    policies = [d for d in render({"tracing": TRACING})[0] if d["kind"] == "NetworkPolicy"]
    (policy,) = [p for p in policies if p["metadata"]["name"].endswith("-ray")]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress (to the collector) stays open


@pytest.mark.parametrize(
    ("values", "messages"),
    [
        (
            {"tracing": TRACING, "platform": {"tracing": {"otlp_endpoint": ENDPOINT}}},
            ["tracing.otlpEndpoint and platform.tracing.otlp_endpoint are both set"],
        ),
        (
            {"tracing": {"sampleRatio": 0.5}, "platform": {"tracing": {"sample_ratio": 1}}},
            ["tracing.sampleRatio and platform.tracing.sample_ratio are both set"],
        ),
        (
            {"tracing": {"otlpEndpoint": "otel-collector:4317"}},
            ['"otel-collector:4317" is not an http(s) URL', "http://otel-collector"],
        ),
        ({"tracing": {"protocol": "thrift"}}, ["/tracing/protocol"]),
        ({"tracing": {"sampleRatio": 2}}, ["/tracing/sampleRatio"]),
    ],
    ids=["endpoint twice", "ratio twice", "not a URL", "unknown protocol", "ratio over 1"],
)
def test_bad_tracing_values_are_refused(values: dict[str, Any], messages: list[str]) -> None:
    with pytest.raises(k8s_render.RenderError) as refused:
        k8s_render.render_templates(values)
    for message in messages:
        assert message in str(refused.value)


def test_the_template_maps_the_values_as_python_does() -> None:
    text = (CHART_DIR / "templates" / "_tracing.tpl").read_text()
    body = re.search(r'define "llm-serving.tracingKeys" -}}\n(.*?)\n', text)
    assert body and json.loads(body[1]) == TRACING_KEYS
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["tracing"]
    assert set(TRACING_KEYS) == set(defaults)


def guide_examples() -> list[dict[str, Any]]:
    """The values examples (```yaml blocks) of the guide's "On a cluster" section."""
    section = GUIDE.read_text().split("\n## On a cluster\n", 1)[1].split("\n## ", 1)[0]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def test_the_guides_examples_render() -> None:
    examples = guide_examples()
    assert len(examples) >= 4
    for values in examples:
        docs, merged = render(values)
        platform = expected_platform(docs, merged)
        tracing = serve_apps(docs)["vllm"]["args"].get("tracing")
        if "tracing" in values:
            assert tracing == platform.tracing.model_dump(exclude_unset=True), values
            assert platform.tracing.enabled

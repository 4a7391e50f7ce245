"""Zero replicas on a GPU cluster (issue 37): when every app on the GPU may scale to zero, the GPU
worker group may too (its minReplicas 0, no disruption budget), KubeRay's in-tree autoscaler is on
to bring a worker back, Serve gets the scale-to-zero options, and vLLM's compile cache lives on
the shared model cache claim. Chart and operator derive the same minimum."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from operators.render import render_owned
from operators.spec import parse_spec
from serving.config import PlatformConfig
from serving.k8s import chart as k8s_render
from serving.k8s.gpu_workers import gpu_worker_min
from tests.k8s.conftest import ray_containers, rendered, values_of

Doc = dict[str, Any]
AT_ZERO = {"autoscaling": {"min_replicas": 0, "max_replicas": 2}}


def worker_groups(rayservice: Doc) -> dict[str, Doc]:
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {group["groupName"]: group for group in groups}


def budgets(docs: list[Doc]) -> set[str]:
    return {d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"}


def rayservice(docs: list[Doc]) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == "RayService"]
    return doc


def test_gpu_workers_go_to_zero_with_the_gpu_apps() -> None:
    case = rendered("scale-to-zero")
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    gpu = worker_groups(case.one("RayService"))["gpu"]
    assert (gpu["replicas"], gpu["minReplicas"], gpu["maxReplicas"]) == (1, 0, 4)
    assert cluster["enableInTreeAutoscaling"] is True
    assert budgets(case.docs) == {"llm-serving-cpu-workers"}  # none holds a GPU worker up


def test_serve_gets_the_scale_to_zero_options() -> None:
    serve = yaml.safe_load(rendered("scale-to-zero").one("RayService")["spec"]["serveConfigV2"])
    (vllm,) = [app for app in serve["applications"] if app["name"] == "vllm"]
    scaling = vllm["deployments"][0]["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["initial_replicas"]) == (0, 1)
    assert scaling["downscale_to_zero_delay_s"] == 3600


def test_a_gpu_app_that_keeps_a_replica_keeps_a_worker() -> None:
    """The default (min_replicas 1), and a model at zero beside one that is not."""
    assert worker_groups(rendered("default").one("RayService"))["gpu"]["minReplicas"] == 1
    values = values_of("multi-model")
    values["platform"]["models"][0]["autoscaling"]["min_replicas"] = 0  # smollm2 keeps 1
    docs = k8s_render.render_documents(values)
    assert worker_groups(rayservice(docs))["gpu"]["minReplicas"] == 1
    assert "llm-serving-gpu-workers" in budgets(docs)


def test_every_model_at_zero_frees_the_gpu_workers() -> None:
    values = values_of("multi-model")
    values["platform"]["models"][0]["autoscaling"]["min_replicas"] = 0
    smollm2 = values["platform"]["models"][1]
    smollm2.pop("num_replicas")
    smollm2 |= AT_ZERO
    docs = k8s_render.render_documents(values)
    assert worker_groups(rayservice(docs))["gpu"]["minReplicas"] == 0
    assert "llm-serving-gpu-workers" not in budgets(docs)


def test_a_minimum_given_is_kept() -> None:
    """A warm GPU node by choice: the pod stays, the cold start is the replica's alone."""
    values = values_of("scale-to-zero") | {"workers": {"gpu": {"minReplicas": 1}}}
    docs = k8s_render.render_documents(values)
    assert worker_groups(rayservice(docs))["gpu"]["minReplicas"] == 1
    assert "llm-serving-gpu-workers" in budgets(docs)


def test_no_workers_and_no_autoscaler_is_refused() -> None:
    values = values_of("scale-to-zero") | {"autoscaler": {"enabled": False}}
    values["workers"] = {"gpu": {"replicas": 0}}
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_templates(values)
    assert "workers.gpu: replicas 0 with autoscaler.enabled=false" in str(err.value)
    assert "set autoscaler.enabled=true" in str(err.value).lower()


@pytest.mark.parametrize(
    "platform",
    [
        {},
        {"vllm": AT_ZERO | {"resources": {"accelerator": "gpu"}}},
        {"vllm": {"resources": {"accelerator": "gpu"}}},
        {"vllm": AT_ZERO | {"resources": {"accelerator": "cpu"}}},
    ],
)
def test_chart_and_operator_derive_the_same_minimum(platform: Doc) -> None:
    values = {"platform": platform, "workers": {"gpu": {"maxReplicas": 4}}}
    chart_min = worker_groups(rayservice(k8s_render.render_documents(values)))["gpu"]["minReplicas"]
    merged = k8s_render.merged_values(values)["platform"]
    assert chart_min == gpu_worker_min(PlatformConfig.model_validate(merged))


def llmservice(**fields: Any) -> Doc:
    platform = {"vllm": AT_ZERO | {"resources": {"accelerator": "gpu"}}}
    platform |= {"hf": {"enabled": False}, "analysis": {"enabled": False}}
    return {"image": "registry.example.com/llm-serving-gpu:0.1.0", "platform": platform} | fields


def test_the_operator_frees_gpu_workers_when_its_apps_may_go_to_zero() -> None:
    owned = render_owned("qwen", "ns", parse_spec(llmservice()))
    gpu = worker_groups(owned.rayservice)["gpu"]
    assert (gpu["replicas"], gpu["minReplicas"], gpu["maxReplicas"]) == (1, 0, 4)
    assert owned.rayservice["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert owned.budgets == []


def test_the_operators_workers_min_is_kept() -> None:
    owned = render_owned("qwen", "ns", parse_spec(llmservice(workers={"min": 1, "max": 4})))
    gpu = worker_groups(owned.rayservice)["gpu"]
    assert (gpu["replicas"], gpu["minReplicas"]) == (1, 1)
    assert [b["metadata"]["name"] for b in owned.budgets] == ["qwen-gpu-workers"]


def vllm_env(rayservice_doc: Doc) -> list[dict[str, str]]:
    return [
        {item["name"]: item.get("value") for item in container.get("env", [])}
        for container in ray_containers(rayservice_doc)
    ]


def test_vllms_compile_cache_lives_on_the_model_cache_claim() -> None:
    case = rendered("scale-to-zero")
    mount = case.merged["model"]["cache"]["mountPath"]
    for env in vllm_env(case.one("RayService")):
        assert env["VLLM_CACHE_ROOT"] == f"{mount}/vllm"


def test_without_a_claim_vllm_keeps_its_own_cache_path() -> None:
    """An emptyDir dies with its pod: nothing to reuse, so vLLM's default (~/.cache/vllm)."""
    for env in vllm_env(rendered("default").one("RayService")):
        assert "VLLM_CACHE_ROOT" not in env


def chart_refusal(values: Doc) -> str:
    with pytest.raises(k8s_render.RenderError) as err:
        k8s_render.render_templates(values)
    return str(err.value)


def test_sleep_mode_on_the_cpu_is_refused_at_install() -> None:
    """As PlatformConfig refuses it: the chart fails now, not the replica at its start."""
    engine = {"sleep_when_idle_s": 300}
    cpu = {"platform": {"vllm": {"resources": {"accelerator": "cpu"}, "engine": engine}}}
    assert "platform.vllm.engine.sleep_when_idle_s: vLLM's sleep mode needs a GPU" in (
        chart_refusal(cpu)
    )
    inprocess = {"platform": {"vllm": {"engine": engine | {"engine_core": "inprocess"}}}}
    assert "needs engine_core: process" in chart_refusal(inprocess)


def test_sleep_mode_on_a_gpu_model_reaches_its_app() -> None:
    values = values_of("multi-model")
    values["platform"]["models"][0]["engine"]["sleep_when_idle_s"] = 300
    serve = yaml.safe_load(rayservice(k8s_render.render_documents(values))["spec"]["serveConfigV2"])
    (qwen,) = [app for app in serve["applications"] if app["name"] == "vllm-qwen"]
    assert qwen["args"]["vllm"]["engine"]["sleep_when_idle_s"] == 300
    on_cpu = values_of("multi-model")
    on_cpu["platform"]["models"][1] |= {"resources": {"accelerator": "cpu"}}
    on_cpu["platform"]["models"][1]["engine"] = {"sleep_when_idle_s": 300}
    assert "platform.models (smollm2).engine.sleep_when_idle_s" in chart_refusal(on_cpu)

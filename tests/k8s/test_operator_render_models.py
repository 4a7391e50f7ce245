"""operators.render through the chart for a two-model LLMService
(k8s/examples/llmservice-multi-model.yaml): the router app and one app per model, every model
prefetched, only GPU models on GPU workers, and a RayService KubeRay's CRD accepts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from operators.render import needs_cpu_group, render_rayservice
from operators.spec import LLMServiceSpec, parse_spec
from serving.config import apps as registry
from tests.k8s.conftest import repo_path
from tests.k8s.schemas import crd_errors, crds_available
from tests.unit.operators.test_models import RAYSERVICE_STATUS

EXAMPLE = yaml.safe_load(repo_path("k8s", "examples", "llmservice-multi-model.yaml").read_text())
Doc = dict[str, Any]


def spec(**changes: Any) -> Doc:
    return copy.deepcopy(EXAMPLE["spec"]) | changes


def rendered(typed: Doc | LLMServiceSpec | None = None) -> Doc:
    return render_rayservice("team-models", "ns", spec() if typed is None else typed)


def test_two_models_render_the_router_and_an_app_per_model() -> None:
    serve = yaml.safe_load(rendered()["spec"]["serveConfigV2"])
    apps = {app["name"]: app for app in serve["applications"]}
    assert list(apps) == ["vllm", "vllm-qwen", "vllm-qwen-1.5b"]
    assert apps["vllm"]["import_path"] == registry.ROUTER_BUILDER
    assert apps["vllm-qwen"]["args"]["model"]["served_name"] == "qwen"
    assert apps["vllm-qwen"]["args"]["vllm"]["adapters"] == [
        {"name": "qwen-demo", "path": "demo:qwen-demo"}
    ]
    router = apps["vllm-qwen-1.5b"]["deployments"][0]["request_router_config"]
    assert router["request_router_class"] == "serving.routing:SessionAffinityRouter"


def worker_cpus(typed: LLMServiceSpec) -> str:
    group = rendered(typed)["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    return group["rayStartParams"]["num-cpus"]


def test_workers_prefetch_every_model_and_run_only_gpu_models() -> None:
    groups = rendered()["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["gpu", "cpu"]  # the router runs on the CPU group
    group = groups[0]
    (init,) = group["template"]["spec"]["initContainers"]
    assert init["command"][3:] == ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"]
    assert group["rayStartParams"] == {"num-cpus": "1"}
    models = spec()["platform"]["models"]
    models[1]["resources"] = {"accelerator": "gpu", "num_cpus": 3}
    assert worker_cpus(parse_spec(spec(platform={**spec()["platform"], "models": models}))) == "3"
    models[1]["resources"] = {"accelerator": "cpu", "num_cpus": 6}  # never on a GPU worker
    cpu_model = parse_spec(spec(platform={**spec()["platform"], "models": models}))
    assert worker_cpus(cpu_model) == "1" and needs_cpu_group(cpu_model)
    groups = rendered(cpu_model)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["gpu", "cpu"]


@pytest.mark.skipif(not crds_available(), reason="KubeRay CRD schemas not in ../shared")
def test_rendered_rayservice_and_kuberays_status_validate_against_kuberays_crd() -> None:
    doc = rendered()
    assert crd_errors(doc) == []
    assert crd_errors({**doc, "status": RAYSERVICE_STATUS}) == []  # the status the tests use

"""operators.render through the chart (Helm's engine): each LLMService knob lands where the chart
puts that value, the chart renders nothing but the RayService, the LLMService's platform is
served as written (none of the chart's platform defaults leak in), the RayService carries the
operator's metadata, and what the chart refuses is a SpecError with Helm's message."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators import render, status
from operators.render import render_rayservice
from operators.spec import SpecError, parse_spec
from serving.k8s import CHART_DIR, CHART_DIR_ENV
from serving.k8s import chart as k8s_render
from serving.k8s.serve_config import serve_config_v2
from tests.k8s.conftest import repo_path
from tests.k8s.schemas import K8S_VERSIONS, crd_errors, crds_available, k8s_errors

EXAMPLE = yaml.safe_load(repo_path("k8s", "examples", "llmservice.yaml").read_text())["spec"]
OWNER = {
    "apiVersion": "serving.llm-serving.io/v1alpha1",
    "kind": "LLMService",
    "metadata": {"name": "qwen", "uid": "u-1"},
}
# Every pod setting, API keys from a Secret in a renamed variable, and a non-default upgrade.
POD_SETTINGS = {
    "imagePullSecrets": [{"name": "regcred"}],
    "hfTokenSecret": {"name": "hf", "key": "token"},
    "modelCacheClaim": "models",
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ],
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference",
}
Doc = dict[str, Any]


def spec(**changes: Any) -> Doc:
    return copy.deepcopy(EXAMPLE) | changes


def cpu_spec(**changes: Any) -> Doc:
    platform = {"vllm": {"resources": {"accelerator": "cpu"}, "num_replicas": 1}}
    return spec(gpusPerReplica=0, platform=platform, resources=None) | changes


def settled_spec() -> Doc:
    platform = copy.deepcopy(EXAMPLE["platform"]) | {"auth": {"api_keys_env": "TEAM_KEYS"}}
    return spec(
        pods=POD_SETTINGS,
        apiKeySecret={"name": "team-keys", "key": "keys"},
        upgradeStrategy="None",
        platform=platform,
    )


def cluster(doc: Doc) -> Doc:
    return doc["spec"]["rayClusterConfig"]


def groups(doc: Doc) -> dict[str, Doc]:
    return {group["groupName"]: group for group in cluster(doc)["workerGroupSpecs"]}


def pods(doc: Doc) -> dict[str, Doc]:
    """Pod spec of the head and of each worker group."""
    found = {"head": cluster(doc)["headGroupSpec"]["template"]["spec"]}
    return found | {name: g["template"]["spec"] for name, g in groups(doc).items()}


def env(container: Doc) -> dict[str, Doc]:
    return {item["name"]: item for item in container["env"]}


def test_rendered_rayservice_is_owned_and_carries_the_knobs() -> None:
    doc = render_rayservice("qwen", "team-a", spec(), owner=OWNER)
    assert doc["metadata"]["namespace"] == "team-a"
    assert doc["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "serving.llm-serving.io/v1alpha1",
            "kind": "LLMService",
            "name": "qwen",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    (group,) = groups(doc).values()  # hf and analysis disabled: no CPU group beside the GPUs
    assert (group["groupName"], group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        "gpu",
        1,
        1,
        4,
    )
    for pod in pods(doc).values():
        assert pod["containers"][0]["image"] == EXAMPLE["image"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"] == EXAMPLE["resources"]["requests"]
    serve = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert [app["name"] for app in serve["applications"]] == ["vllm"]
    assert serve["applications"][0]["args"]["model"]["ref"] == "Qwen/Qwen2.5-0.5B"
    assert doc["spec"]["serveService"]["metadata"]["name"] == "qwen-api"


def test_gpus_per_replica_sizes_the_gpu_group() -> None:
    doc = render_rayservice("qwen", "ns", spec(gpusPerReplica=2, workers={"min": 0, "max": 3}))
    group = groups(doc)["gpu"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 3)
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    # One CPU per vLLM replica (num_cpus 1), two replicas per worker.
    assert group["rayStartParams"] == {"num-cpus": "2"}


def test_zero_gpus_renders_the_cpu_worker_group() -> None:
    (group,) = groups(render_rayservice("tiny", "ns", cpu_spec())).values()
    assert group["groupName"] == "cpu"
    assert "tolerations" not in group["template"]["spec"]
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources["limits"]
    assert resources == k8s_render.merged_values()["workers"]["cpu"]["resources"]


def test_gpu_workers_get_a_cpu_group_only_for_apps_on_the_cpu() -> None:
    assert list(groups(render_rayservice("qwen", "ns", spec()))) == ["gpu"]
    platform = copy.deepcopy(EXAMPLE["platform"]) | {"hf": {"enabled": True}}
    assert list(groups(render_rayservice("qwen", "ns", spec(platform=platform)))) == ["gpu", "cpu"]


def test_given_resources_replace_the_charts() -> None:
    doc = render_rayservice("qwen", "ns", spec(resources={"limits": {"memory": "30Gi"}}))
    container = groups(doc)["gpu"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"memory": "30Gi", "nvidia.com/gpu": 1}}


def test_pod_settings_land_on_the_pods() -> None:
    doc = render_rayservice("qwen", "ns", settled_spec())
    assert doc["spec"]["upgradeStrategy"] == {"type": "None"}
    for role, pod in pods(doc).items():
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], role
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["hf-token"]["secret"]["secretName"] == "hf", role
        cache = volumes["model-cache"]
        # The head runs no replicas: it never holds the shared claim.
        assert ("persistentVolumeClaim" in cache) == (role != "head"), role
        containers = pod["containers"] + pod.get("initContainers", [])
        for container in containers:
            assert env(container)["HF_TOKEN_PATH"]["value"].endswith("/token"), role
        keys = env(pod["containers"][0])["TEAM_KEYS"]
        assert keys["valueFrom"]["secretKeyRef"] == {"name": "team-keys", "key": "keys"}
    gpu, head = pods(doc)["gpu"], pods(doc)["head"]
    assert gpu["volumes"][0]["persistentVolumeClaim"] == {"claimName": "models"}
    placement = ("nodeSelector", "tolerations", "runtimeClassName", "priorityClassName")
    assert {key: gpu[key] for key in placement} == {key: POD_SETTINGS[key] for key in placement}
    assert not set(placement) & set(head)  # placement is the worker group's alone


def test_unset_tolerations_are_the_charts_gpu_taint() -> None:
    gpu = pods(render_rayservice("qwen", "ns", spec()))["gpu"]
    assert gpu["tolerations"] == k8s_render.merged_values()["workers"]["gpu"]["tolerations"]


def test_worker_bounds_change_the_head_template() -> None:
    """KubeRay leaves worker bounds out of its cluster hash: the chart's annotation on the head
    template makes a change of them a new RayCluster."""

    def head_annotations(changes: Doc) -> Doc:
        doc = render_rayservice("qwen", "ns", spec(**changes))
        return cluster(doc)["headGroupSpec"]["template"]["metadata"]["annotations"]

    assert head_annotations({}) != head_annotations({"workers": {"min": 1, "max": 5}})
    assert head_annotations({}) == head_annotations({"image": "other:1"})


@pytest.mark.parametrize(
    "platform",
    [{}, EXAMPLE["platform"], {"model": {"ref": "tiny-qwen2"}, "vllm": {"args": {}}}],
    ids=["platform-config-defaults", "example", "no-extra-args"],
)
def test_the_platform_is_served_as_written(platform: Doc) -> None:
    """The chart's own platform values (its model, autoscaling, tool-call args) do not leak in:
    the serve config is the one serving.k8s builds from the LLMService's PlatformConfig."""
    typed = parse_spec(spec(platform=platform))
    doc = render_rayservice("qwen", "ns", typed)
    assert yaml.safe_load(doc["spec"]["serveConfigV2"]) == serve_config_v2(typed.platform)


def test_the_chart_renders_nothing_but_what_the_operator_owns() -> None:
    """Whatever else the chart can create (Services, monitors, Secrets, PVC, test pod) the
    operator does not own: its values turn all of it off, but for the NetworkPolicy and the
    worker group's PodDisruptionBudget."""
    owned = ["NetworkPolicy", "PodDisruptionBudget", "RayService"]
    for typed in (parse_spec(spec()), parse_spec(settled_spec()), parse_spec(cpu_spec())):
        values = render.chart_values("qwen", typed, k8s_render.merged_values())
        docs = k8s_render.render_documents(values, release="qwen", namespace="ns")
        assert sorted(doc["kind"] for doc in docs) == owned


def test_rayservice_carries_the_operators_labels() -> None:
    doc = render_rayservice("qwen", "ns", spec())
    for labels in (doc["metadata"]["labels"], doc["spec"]["serveService"]["metadata"]["labels"]):
        assert labels["app.kubernetes.io/managed-by"] == "llm-serving-operator"
        assert labels["serving.llm-serving.io/llmservice"] == "qwen"
        assert labels["app.kubernetes.io/instance"] == "qwen"


def test_names_keep_every_character_kuberay_allows() -> None:
    """The chart cuts its fullname at 40 characters; the operator looks both objects up by the
    LLMService's name (up to 47)."""
    name = "a" * 47
    doc = render_rayservice(name, "ns", spec())
    assert doc["metadata"]["name"] == name
    service = doc["spec"]["serveService"]["metadata"]["name"]
    assert status.endpoint_url(name, "ns", parse_spec(spec()).platform).startswith(
        f"http://{service}.ns.svc"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": ""}, "at '/image/repository': minLength"),
        (
            {
                "platform": {
                    "models": [{"name": "qwen", "model": {"ref": "Qwen/Qwen2.5-0.5B"}}],
                    "vllm": {"engine": {"max_num_seqs": 64}},
                }
            },
            "platform.vllm.engine: with platform.models each model sets its own",
        ),
    ],
    ids=["values-schema", "chart-validation"],
)
def test_what_the_chart_refuses_is_a_spec_error(changes: Doc, message: str) -> None:
    with pytest.raises(SpecError, match="the chart refused the spec") as err:
        render_rayservice("qwen", "ns", cpu_spec(**changes))
    assert message in str(err.value)


@pytest.mark.skipif(not crds_available(), reason="KubeRay CRD schemas not in ../shared")
@pytest.mark.parametrize("changes", [{}, {"gpusPerReplica": 0, "platform": {}}])
def test_rendered_rayservice_validates_against_kuberays_crd(changes: Doc) -> None:
    assert crd_errors(render_rayservice("qwen", "ns", spec(**changes), owner=OWNER)) == []


def test_the_chart_may_live_outside_the_repository(tmp_path: Path) -> None:
    """An image has no repository: it copies the chart and names it in LLM_SERVING_CHART_DIR."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace('version: ""', 'version: "9.9.9"', 1))
    code = (
        "import json; from operators.render import render_rayservice as r; "
        "print(json.dumps(r('qwen', 'ns', {'image': 'i:1'})['spec']['rayClusterConfig']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=os.environ | {CHART_DIR_ENV: str(chart)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1])["rayVersion"] == "9.9.9"


def test_ray_token_auth_by_default_and_rayauth_switches_it() -> None:
    default = render_rayservice("qwen", "ns", spec())
    assert cluster(default)["authOptions"] == {"mode": "token"}
    disabled = render_rayservice("qwen", "ns", spec(rayAuth="disabled"))
    assert cluster(disabled)["authOptions"] == {"mode": "disabled"}
    if crds_available():
        assert crd_errors(default) == [] and crd_errors(disabled) == []


def test_network_policy_guards_the_ray_pods_and_lets_the_operator_scrape() -> None:
    rayservice, policy, _ = render.render_owned("qwen", "team-a", spec(), owner=OWNER)
    assert policy is not None
    meta = policy["metadata"]
    assert (meta["name"], meta["namespace"]) == ("qwen-ray", "team-a")
    assert meta["ownerReferences"] == rayservice["metadata"]["ownerReferences"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "llm-serving-operator"
    selector = policy["spec"]["podSelector"]["matchLabels"]
    templates = [cluster(rayservice)["headGroupSpec"]["template"]]
    templates += [g["template"] for g in cluster(rayservice)["workerGroupSpecs"]]
    for template in templates:
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items())
    (metrics,) = [
        r
        for r in policy["spec"]["ingress"]
        if {"port": 8080, "protocol": "TCP"} in r.get("ports", [])
    ]
    assert render.OPERATOR_PEER in metrics["from"]
    assert k8s_render.merged_values()["networkPolicy"]["metricsFrom"][0] in metrics["from"]
    assert [p for v in K8S_VERSIONS for p in k8s_errors(policy, v)] == []
    assert render.render_owned("qwen", "ns", spec(networkPolicy=False)).network_policy is None


def test_operator_pods_carry_the_label_policies_let_in() -> None:
    docs = k8s_render.render_documents({"operator": {"enabled": True}})
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert render.OPERATOR_POD_LABELS.items() <= labels.items()
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "patch", "delete"],
    } in role["rules"]


def test_incremental_upgrade_reaches_the_rayservice() -> None:
    """Failed before: an LLMService could ask for NewClusterWithIncrementalUpgrade but not give
    its options, so the chart rendered a RayService KubeRay refuses."""
    options = {"gatewayClassName": "istio", "stepSizePercent": 20}
    given = spec(upgradeStrategy="NewClusterWithIncrementalUpgrade", incrementalUpgrade=options)
    strategy = render_rayservice("qwen", "ns", given)["spec"]["upgradeStrategy"]
    assert strategy["clusterUpgradeOptions"] == {
        "gatewayClassName": "istio",
        "stepSizePercent": 20,
        "intervalSeconds": 30,
        "maxSurgePercent": 100,
    }
    with pytest.raises(SpecError, match="needs incrementalUpgrade"):
        parse_spec(spec(upgradeStrategy="NewClusterWithIncrementalUpgrade"))


def test_worker_groups_get_owned_disruption_budgets() -> None:
    """Failed before: the operator switched the chart's budgets off, so `kubectl drain` could
    evict an LLMService's only GPU worker."""
    owned = render.render_owned("qwen", "team-a", spec(workers={"min": 2, "max": 4}), owner=OWNER)
    (budget,) = owned.budgets  # the example runs no app on the CPU: no CPU group
    meta = budget["metadata"]
    assert (meta["name"], meta["namespace"]) == ("qwen-gpu-workers", "team-a")
    assert meta["name"] in render.budget_names("qwen")
    assert meta["ownerReferences"] == owned.rayservice["metadata"]["ownerReferences"]
    assert budget["spec"]["minAvailable"] == 2
    (gpu,) = cluster(owned.rayservice)["workerGroupSpecs"]
    labels = gpu["template"]["metadata"]["labels"] | {"ray.io/group": gpu["groupName"]}
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p for v in K8S_VERSIONS for p in k8s_errors(budget, v)] == []
    assert render.render_owned("qwen", "ns", spec(workers={"min": 0, "max": 4})).budgets == []

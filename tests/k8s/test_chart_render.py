"""The chart renders every values file of the matrix with Helm's engine, passes `helm lint --strict`,
and the default render is the GPU platform the issue asks for."""

from __future__ import annotations

import json
import re

import pytest

from serving import k8s_render, metrics
from serving.config import ray_env
from serving.k8s import CHART_DIR
from serving.k8s_schema import undocumented_values
from tests.k8s.conftest import MATRIX, Rendered, ray_containers, rendered

GPU = "nvidia.com/gpu"


def test_matrix_covers_the_issue() -> None:
    assert {"default", "gpu-cluster", "cpu-dev", "monitoring-off", "device-plugin-off", "pvc-cache"} <= set(MATRIX)


def test_renders_one_rayservice(case: Rendered) -> None:
    rayservice = case.one("RayService")
    assert rayservice["apiVersion"] == "ray.io/v1"
    assert all(doc["metadata"]["name"] for doc in case.docs)


@pytest.mark.parametrize("name", MATRIX)
def test_lint_strict(name: str) -> None:
    values = rendered(name).values
    assert k8s_render.lint(values) == []
    assert k8s_render.lint(values, kube_version="v1.30.0") == []


def worker_groups(case: Rendered) -> dict[str, dict]:
    groups = case.one("RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {group["groupName"]: group for group in groups}


def test_default_is_the_gpu_platform() -> None:
    case = rendered("default")
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert GPU not in head["resources"].get("limits", {})
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpu = worker_groups(case)["gpu"]
    worker = gpu["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"][GPU] == 1
    assert (gpu["minReplicas"], gpu["maxReplicas"]) == (1, 4)
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in gpu["template"]["spec"]["tolerations"]
    assert case.one("DaemonSet")["metadata"]["name"].endswith("nvidia-device-plugin")
    vllm = case.platform.vllm
    assert vllm.resources.accelerator == "gpu"
    assert vllm.autoscaling is not None and vllm.autoscaling.max_replicas == 4


def test_ray_containers_get_ray_env(case: Rendered) -> None:
    expected = ray_env(case.platform)
    for container in ray_containers(case.one("RayService")):
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert {key: env.get(key) for key in expected} == expected


def test_ray_env_follows_the_fastest_interval() -> None:
    values = {"platform": {"vllm": {"autoscaling": {"metrics_interval_s": 2.5}},
                           "hf": {"autoscaling": {"metrics_interval_s": 0.5}}}}
    rayservice = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
    merged = k8s_render.merged_values(values)
    from serving.config import PlatformConfig

    expected = ray_env(PlatformConfig.model_validate(merged["platform"]))
    env = {e["name"]: e.get("value") for e in ray_containers(rayservice)[0]["env"]}
    assert expected["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] == "0.5"
    assert {key: env[key] for key in expected} == expected


def test_pods_run_as_non_root(case: Rendered) -> None:
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        for container in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_probes_never_look_at_the_model(case: Rendered) -> None:
    """Liveness checks Ray itself, so a replica loading weights never gets its pod restarted."""
    for container in ray_containers(case.one("RayService")):
        assert container["livenessProbe"]["httpGet"]["path"] in ("/api/gcs_healthz", "/api/local_raylet_healthz")
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_pvc_cache_is_shared_by_workers_only() -> None:
    case = rendered("pvc-cache")
    claim = case.one("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    volumes = {v["name"]: v for v in cluster["workerGroupSpecs"][0]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    head_volumes = {v["name"]: v for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in head_volumes["model-cache"]
    secret = case.one("Secret")
    assert volumes["hf-token"]["secret"]["secretName"] == secret["metadata"]["name"]
    prefetch = cluster["workerGroupSpecs"][0]["template"]["spec"]["initContainers"][0]
    assert prefetch["command"][-1] == "Qwen/Qwen2.5-0.5B"
    env = {e["name"]: e.get("value") for e in prefetch["env"]}
    assert env["HF_TOKEN_PATH"].endswith("/HF_TOKEN")


def test_cpu_dev_has_no_gpu_anywhere() -> None:
    case = rendered("cpu-dev")
    assert not case.kinds("DaemonSet")
    assert set(worker_groups(case)) == {"cpu"}
    for container in ray_containers(case.one("RayService")):
        assert GPU not in container["resources"].get("limits", {})
        assert container["image"].startswith("llm-serving-cpu:")
    assert case.platform.model.ref == "tiny-qwen2"


@pytest.mark.parametrize(
    ("name", "absent", "present"),
    [
        ("monitoring-off", {"ServiceMonitor", "PodMonitor", "ConfigMap"}, set()),
        ("podmonitor", {"ServiceMonitor"}, {"PodMonitor"}),
        ("device-plugin-off", {"DaemonSet"}, {"ServiceMonitor", "ConfigMap"}),
        ("gpu-cluster", {"DaemonSet"}, {"Ingress", "PersistentVolumeClaim"}),
    ],
)
def test_toggles(name: str, absent: set[str], present: set[str]) -> None:
    kinds = {doc["kind"] for doc in rendered(name).docs}
    assert not kinds & absent
    assert present <= kinds


def test_monitors_select_what_the_pods_expose() -> None:
    default = rendered("default")
    service = next(d for d in default.kinds("Service") if d["metadata"]["name"].endswith("-metrics"))
    selector = default.one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    pod_labels = default.one("RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    podmonitor = rendered("podmonitor").one("PodMonitor")["spec"]["selector"]["matchLabels"]
    assert podmonitor.items() <= pod_labels.items()


def test_notes_tell_how_to_reach_api_and_dashboard() -> None:
    notes = rendered("default").notes
    assert "port-forward svc/llm-serving-api 8000:8000" in notes
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in notes
    assert "port-forward svc/llm-serving-dashboard 8265:8265" in notes


def test_every_value_is_documented() -> None:
    assert undocumented_values((CHART_DIR / "values.yaml").read_text()) == []


def test_dashboard_queries_name_platform_metrics() -> None:
    dashboard = json.loads((CHART_DIR / "dashboards" / "llm-serving.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\b(ray_[a-z_]+)\b", expr)}
    ours = {f"ray_{name}" for name in metrics.DESCRIPTIONS}
    known = ours | {f"{name}_bucket" for name in ours} | {"ray_serve_deployment_replica_healthy"}
    assert named <= known
    for required in ("QUEUE_DEPTH", "TTFT", "ITL", "GENERATION_TOKENS", "KV_CACHE_USAGE", "REQUESTS"):
        assert any(f"ray_{getattr(metrics, required)}" in expr for expr in exprs), required
    configmap = rendered("default").one("ConfigMap")
    assert json.loads(configmap["data"]["llm-serving.json"]) == dashboard

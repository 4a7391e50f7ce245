"""The chart renders every values file of the matrix with Helm's engine, passes `helm lint --strict`,
and the default render is the GPU platform the issue asks for."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from serving import metrics
from serving.config import PlatformConfig
from serving.config.ray_env import ray_env
from serving.k8s import CHART_DIR
from serving.k8s import chart as k8s_render
from serving.k8s.values_schema import undocumented_values, value_comments
from tests.k8s.conftest import MATRIX, Rendered, ray_containers, rendered

GPU = "nvidia.com/gpu"


def test_matrix_covers_the_issue() -> None:
    assert {
        "default",
        "gpu-cluster",
        "cpu-dev",
        "monitoring-off",
        "device-plugin-on",
        "prometheus-operator",
        "pvc-cache",
        "multi-model",
    } <= set(MATRIX)


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
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in gpu["template"]["spec"][
        "tolerations"
    ]
    # The cluster's GPU operator or provider runs the device plugin; no Prometheus operator is
    # assumed (offline renders cannot see monitoring.coreos.com/v1).
    assert not case.kinds("DaemonSet") and not case.kinds("ServiceMonitor")
    assert case.one("RayService")["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    # GPU workers advertise only vLLM's CPUs; the HF baseline and analysis get a CPU group.
    assert gpu["rayStartParams"]["num-cpus"] == "1"
    cpu = worker_groups(case)["cpu"]
    assert GPU not in cpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    vllm = case.platform.vllm
    assert vllm.resources.accelerator == "gpu"
    assert vllm.autoscaling is not None and vllm.autoscaling.max_replicas == 4


def test_ray_containers_get_ray_env(case: Rendered) -> None:
    expected = ray_env(case.platform)
    for container in ray_containers(case.one("RayService")):
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert {key: env.get(key) for key in expected} == expected


def test_ray_env_follows_the_fastest_interval() -> None:
    values = {
        "platform": {
            "vllm": {"autoscaling": {"metrics_interval_s": 2.5}},
            "hf": {"autoscaling": {"metrics_interval_s": 0.5}},
        }
    }
    rayservice = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
    merged = k8s_render.merged_values(values)
    from serving.config import PlatformConfig

    expected = ray_env(PlatformConfig.model_validate(merged["platform"]))
    env = {e["name"]: e.get("value") for e in ray_containers(rayservice)[0]["env"]}
    assert expected["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] == "0.5"
    assert {key: env[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("http", "drain"), [({"replica_drain_s": 2.5}, "2.5"), ({}, "30"), ({"ingress": "proxy"}, None)]
)
def test_replica_drain_reaches_ray_with_the_haproxy_ingress(http: dict, drain: str | None) -> None:
    values = {"platform": {"http": http}}
    rayservice = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
    env = {e["name"]: e.get("value") for e in ray_containers(rayservice)[0]["env"]}
    assert env.get("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S") == drain
    platform = PlatformConfig.model_validate(k8s_render.merged_values(values)["platform"])
    assert ray_env(platform).get("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S") == drain


def test_pods_run_as_non_root(case: Rendered) -> None:
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for template in templates:
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        for container in template["spec"]["containers"] + template["spec"].get(
            "initContainers", []
        ):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_probes_never_look_at_the_model(case: Rendered) -> None:
    """Liveness checks Ray itself, so a replica loading weights never gets its pod restarted."""
    for container in ray_containers(case.one("RayService")):
        assert container["livenessProbe"]["httpGet"]["path"] in (
            "/api/gcs_healthz",
            "/api/local_raylet_healthz",
        )
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_pvc_cache_is_shared_by_workers_only() -> None:
    case = rendered("pvc-cache")
    claim = case.one("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # workers on many nodes share it
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    volumes = {v["name"]: v for v in cluster["workerGroupSpecs"][0]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    head_volumes = {v["name"]: v for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in head_volumes["model-cache"]
    (secret,) = [s for s in case.kinds("Secret") if s["metadata"]["name"].endswith("-hf-token")]
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
        ("device-plugin-on", set(), {"DaemonSet", "ConfigMap"}),
        ("prometheus-operator", {"DaemonSet"}, {"ServiceMonitor"}),
        ("gpu-cluster", {"DaemonSet"}, {"Ingress", "PersistentVolumeClaim"}),
    ],
)
def test_toggles(name: str, absent: set[str], present: set[str]) -> None:
    kinds = {doc["kind"] for doc in rendered(name).docs}
    assert not kinds & absent
    assert present <= kinds


def test_monitors_select_what_the_pods_expose() -> None:
    default = rendered("prometheus-operator")
    service = next(
        d for d in default.kinds("Service") if d["metadata"]["name"].endswith("-metrics")
    )
    selector = default.one("ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    pod_labels = default.one("RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]["template"][
        "metadata"
    ]["labels"]
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


def test_platform_values_are_described_by_platform_config_alone() -> None:
    """No `# --` doc comment under `platform`: its keys' descriptions are PlatformConfig's, in the
    values schema and the config reference, so there is no second copy to drift."""
    comments = value_comments((CHART_DIR / "values.yaml").read_text())
    assert [path for path in comments if path.startswith("platform.")] == []


def test_dashboard_queries_name_platform_metrics() -> None:
    dashboard = json.loads((CHART_DIR / "dashboards" / "llm-serving.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\b(ray_[a-z_]+)\b", expr)}
    ours = {f"ray_{name}" for name in metrics.DESCRIPTIONS}
    known = ours | {f"{name}_bucket" for name in ours} | {"ray_serve_deployment_replica_healthy"}
    assert named <= known
    for required in (
        "QUEUE_DEPTH",
        "TTFT",
        "ITL",
        "GENERATION_TOKENS",
        "KV_CACHE_USAGE",
        "REQUESTS",
    ):
        assert any(f"ray_{getattr(metrics, required)}" in expr for expr in exprs), required
    configmap = rendered("default").one("ConfigMap")
    assert json.loads(configmap["data"]["llm-serving.json"]) == dashboard


def test_notes_hint_at_pending_gpu_workers() -> None:
    """No device plugin by default: the notes say how to see whether nodes advertise GPUs."""
    notes = rendered("default").notes
    assert "GPU workers stay Pending unless the nodes advertise nvidia.com/gpu" in notes
    assert "this release runs no device" in notes and "devicePlugin.enabled=true" in notes
    assert "this release runs no device" not in rendered("device-plugin-on").notes


def test_device_plugin_takes_runtime_class_and_no_system_priority() -> None:
    default = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["devicePlugin"]
    assert default["enabled"] is False and default["priorityClassName"] == ""
    pod = rendered("device-plugin-on").one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and "priorityClassName" not in pod


def test_worker_scaling_change_rolls_a_new_cluster() -> None:
    """KubeRay leaves worker bounds out of its cluster hash: the chart hashes them into the head
    template, so `--set workers.gpu.maxReplicas=8` is not silently ignored on upgrade."""

    def head_annotations(values: dict) -> dict:
        rs = next(d for d in k8s_render.render_documents(values) if d["kind"] == "RayService")
        return rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"][
            "annotations"
        ]

    key = "llm-serving.io/worker-scaling"
    default = head_annotations({})[key]
    assert head_annotations({"workers": {"gpu": {"maxReplicas": 8}}})[key] != default
    assert head_annotations({"platform": {"analysis": {"enabled": False}}})[key] == default


def test_pod_settings_pass_through() -> None:
    values = {
        "serviceAccount": {"create": True},
        "extraEnv": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "workers": {
            "gpu": {
                "runtimeClassName": "nvidia",
                "priorityClassName": "gpu-high",
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
                ],
            }
        },
        "ray": {
            "gcsFaultTolerance": {
                "enabled": True,
                "redisAddress": "redis:6379",
                "redisPasswordSecret": {"name": "redis", "key": "password"},
            }
        },
    }
    docs = k8s_render.render_documents(values)
    rayservice = next(d for d in docs if d["kind"] == "RayService")
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["gcsFaultToleranceOptions"]["redisAddress"] == "redis:6379"
    gpu = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "gpu")["template"][
        "spec"
    ]
    assert (gpu["runtimeClassName"], gpu["priorityClassName"]) == ("nvidia", "gpu-high")
    assert gpu["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    for container in ray_containers(rayservice):
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in container["env"]
        assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
    assert gpu["serviceAccountName"] == account


def test_helm_test_pod_checks_a_chat_completion() -> None:
    pod = rendered("default").one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["URL"] == "http://llm-serving-api.default.svc:8000"
    assert "/v1/chat/completions" in container["args"][0] and "choices" in container["args"][0]


def test_replicas_panel_survives_scrapes_without_the_gauge() -> None:
    """Ray exports the replica gauge in about one scrape in five; a range function skips the
    staleness markers between, so the panel does not blink out."""
    dashboard = json.loads((CHART_DIR / "dashboards" / "llm-serving.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    replica = [e for e in exprs if "ray_serve_deployment_replica_healthy" in e]
    assert replica and all(
        "last_over_time(ray_serve_deployment_replica_healthy[" in e for e in replica
    )


def fake_release(answer: dict):
    """A loopback stand-in for the release's API Service: every chat completion gets `answer`."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(_request) -> JSONResponse:
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


GOOD_ANSWER = {
    "object": "chat.completion",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}


@pytest.mark.parametrize(
    ("answer", "passes"),
    [
        (GOOD_ANSWER, True),
        ({**GOOD_ANSWER, "choices": []}, False),
        ({**GOOD_ANSWER, "usage": {"completion_tokens": 0}}, False),
    ],
    ids=["openai-shape", "no-choice", "no-tokens"],
)
def test_helm_test_script_passes_only_an_openai_answer(answer: dict, passes: bool) -> None:
    """The test pod's own script, run against a loopback server in place of the release."""
    import subprocess
    import sys

    from tests.unit.loopback import serve_on_loopback

    container = rendered("default").one("Pod")["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    with serve_on_loopback(fake_release(answer)) as url:
        done = subprocess.run(
            [sys.executable, "-c", container["args"][0]],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "URL": url},
        )
    assert (done.returncode == 0) is passes, done.stderr[-500:]
    if passes:
        assert done.stdout.strip() == "ok: Paris."

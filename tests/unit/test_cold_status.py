"""Which models are cold (no replica running): `llm-serving status` from Serve's status, the model
router from `serve.status()`, the operator's LLMService status from Ray's metrics."""

from __future__ import annotations

from types import SimpleNamespace

from operators import status
from serving.cli import cold_apps
from serving.config import parse_config
from serving.deployments.model_router import running_replicas


def app(deployments: dict[str, dict[str, int]]) -> dict:
    return {
        "status": "RUNNING",
        "deployments": {
            name: {"status": "HEALTHY", "replicas": replicas}
            for name, replicas in deployments.items()
        },
    }


def test_status_names_the_engine_apps_without_a_running_replica() -> None:
    apps = {
        "vllm": app({"ModelRouter": {"RUNNING": 1}}),  # the router runs no engine
        "vllm-a": app({"ModelEntry": {"RUNNING": 1}, "VLLMServer": {}}),
        "vllm-b": app({"ModelEntry": {"RUNNING": 1}, "VLLMServer": {"RUNNING": 1}}),
        "vllm-c": app({"ModelEntry": {"RUNNING": 1}, "VLLMServer": {"STARTING": 1}}),
    }
    assert cold_apps(apps) == ["vllm-a", "vllm-c"]


def test_the_router_counts_each_models_running_replicas() -> None:
    from ray.serve._private.common import ReplicaState

    def deployment(**states: int) -> SimpleNamespace:
        return SimpleNamespace(replica_states={ReplicaState(k): v for k, v in states.items()})

    serve_status = SimpleNamespace(
        applications={
            "vllm-a": SimpleNamespace(deployments={"VLLMServer": deployment()}),
            "vllm-b": SimpleNamespace(deployments={"VLLMServer": deployment(RUNNING=2)}),
        }
    )
    apps = {"a": "vllm-a", "b": "vllm-b", "c": "vllm-c"}
    assert running_replicas(serve_status, apps) == {"a": 0, "b": 2}  # c: not known


METRICS = """
# TYPE ray_serve_autoscaling_desired_replicas gauge
ray_serve_autoscaling_desired_replicas{application="vllm-a",deployment="VLLMServer"} 0.0
ray_serve_autoscaling_desired_replicas{application="vllm-b",deployment="VLLMServer"} 0.0
ray_serve_autoscaling_desired_replicas{application="vllm-c",deployment="VLLMServer"} 1.0
# TYPE ray_serve_deployment_replica_healthy gauge
ray_serve_deployment_replica_healthy{application="vllm-b",deployment="VLLMServer",replica="r"} 1.0
"""


def test_the_operator_reports_models_the_autoscaler_holds_at_zero() -> None:
    # b still has its replica (the downscale is under way); c and d are not at zero or not known.
    apps = ("vllm-a", "vllm-b", "vllm-c", "vllm-d")
    load = status.load_from_metrics(METRICS, apps)
    assert load.cold_apps == ("vllm-a",)
    config = parse_config(
        {"models": [{"name": name, "model": {"ref": "tiny-qwen2"}} for name in "abcd"]}
    )
    assert status.cold_model_names(config, load) == ["a"]
    assert status.cold_model_names(config, None) is None


def test_a_single_models_app_is_named_by_its_model() -> None:
    config = parse_config({"model": {"ref": "tiny-qwen2", "served_name": "tiny"}})
    load = status.PlatformLoad(0.0, None, cold_apps=("vllm",))
    assert status.cold_model_names(config, load) == [config.model.name]

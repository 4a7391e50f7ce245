"""operators.status: the platform's load from its metrics, and the LLMService status computed from
KubeRay's RayService status (conditions, transition times, failed applications)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from operators import status
from operators.spec import parse_spec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = yaml.safe_load((ROOT / "k8s" / "examples" / "llmservice.yaml").read_text())
NOW = "2026-01-01T00:00:00Z"


def spec(**changes: Any) -> dict[str, Any]:
    return copy.deepcopy(EXAMPLE["spec"]) | changes


METRICS = """
# TYPE ray_serve_autoscaling_total_requests gauge
ray_serve_autoscaling_total_requests{application="vllm",deployment="VLLMServer"} 7.0
ray_serve_autoscaling_total_requests{application="hf",deployment="HFServer"} 3.0
# TYPE ray_serve_deployment_replica_healthy gauge
ray_serve_deployment_replica_healthy{application="vllm",deployment="VLLMServer",replica="a"} 1.0
ray_serve_deployment_replica_healthy{application="vllm",deployment="VLLMServer",replica="b"} 0.0
# TYPE ray_llm_serving_queue_depth gauge
ray_llm_serving_queue_depth{engine="vllm",model="m",deployment="VLLMServer"} 2.0
"""


def test_load_prefers_serves_view_and_counts_healthy_replicas() -> None:
    assert status.load_from_metrics(METRICS) == status.PlatformLoad(7.0, 1, cold_apps=())
    engine_only = "\n".join(
        line for line in METRICS.splitlines() if "serve_autoscaling" not in line
    )
    assert status.load_from_metrics(engine_only).queue_depth == 2.0


def test_unreadable_metrics_mean_unknown_not_a_crash() -> None:
    def refuse(url: str) -> str:
        raise ConnectionError(url)

    assert status.read_load("http://127.0.0.1:9/metrics", refuse) is None
    assert status.read_load("u", lambda url: METRICS).replicas == 1


def conditions(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result["conditions"]}


def observed(
    rayservice: dict[str, Any] | None, load: status.PlatformLoad | None = None
) -> dict[str, Any]:
    return status.observed_status("qwen", "ns", parse_spec(spec()), rayservice, load, 3, [], NOW)


def test_status_follows_kuberay() -> None:
    assert conditions(observed(None))["Progressing"] == ("True", "Deploying")
    ready = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints"}]
        }
    }
    result = observed(ready, status.PlatformLoad(4.0, 2))
    assert conditions(result) == {
        "Ready": ("True", "NonZeroServeEndpoints"),
        "Progressing": ("False", "Deployed"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (result["queueDepth"], result["observedReplicas"], result["observedGeneration"]) == (
        4.0,
        2,
        3,
    )
    assert result["endpoint"] == "http://qwen-api.ns.svc.cluster.local:8000/v1"
    assert result["model"] == "Qwen/Qwen2.5-0.5B"
    assert "queueDepth" not in observed(ready)  # not measured: the last numbers stay
    assert observed(ready, status.PlatformLoad(None, None))["queueDepth"] is None  # unreachable
    older = {
        "status": {"serviceStatus": "Running", "pendingServiceStatus": {"rayClusterName": "b"}}
    }
    assert conditions(observed(older))["Progressing"] == ("True", "Upgrading")


def test_failed_application_degrades_with_kuberays_message() -> None:
    failed = {
        "status": {
            "activeServiceStatus": {
                "applicationStatuses": {
                    "vllm": {"status": "DEPLOY_FAILED", "message": "replica crashed"}
                }
            }
        }
    }
    result = observed(failed)
    degraded = next(c for c in result["conditions"] if c["type"] == "Degraded")
    assert (
        degraded["status"] == "True"
        and degraded["message"] == "vllm: DEPLOY_FAILED (replica crashed)"
    )
    assert conditions(result)["Progressing"][0] == "False"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = status.rejected_status("InvalidSpec", "bad", 1, [], "2026-01-01T00:00:00Z")
    again = status.rejected_status(
        "InvalidSpec", "still bad", 2, first["conditions"], "2026-01-02T00:00:00Z"
    )
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"2026-01-01T00:00:00Z"}
    fixed = status.observed_status(
        "qwen", "ns", parse_spec(spec()), None, None, 3, again["conditions"], "2026-01-03T00:00:00Z"
    )
    times = {c["type"]: c["lastTransitionTime"] for c in fixed["conditions"]}
    assert times == {
        "Ready": "2026-01-01T00:00:00Z",
        "Progressing": "2026-01-03T00:00:00Z",
        "Degraded": "2026-01-03T00:00:00Z",
    }


def test_live_replicas_count_each_vllm_app_on_its_own() -> None:
    healthy = status.SERVE_REPLICA_HEALTHY
    text = (
        f"# TYPE {healthy} gauge\n"
        f'{healthy}{{application="vllm-a",deployment="VLLMServer",replica="1"}} 1.0\n'
        f'{healthy}{{application="vllm-a",deployment="VLLMServer",replica="2"}} 1.0\n'
        f'{healthy}{{application="vllm-a",deployment="VLLMServer",replica="3"}} 0.0\n'
        f'{healthy}{{application="vllm-b",deployment="VLLMServer",replica="4"}} 1.0\n'
        f'{healthy}{{application="hf",deployment="HFServer",replica="5"}} 1.0\n'
    )
    assert status.live_replicas(text, ("vllm-a", "vllm-b")) == {"vllm-a": 2, "vllm-b": 1}


def test_unreadable_metrics_mean_no_live_replicas() -> None:
    def unreachable(url: str) -> str:
        raise OSError("connection refused")

    assert status.read_live_replicas("http://127.0.0.1:9/metrics", unreachable, ("vllm",)) == {}

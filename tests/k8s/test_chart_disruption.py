"""Node drains neither cause outages nor block each other (issue 35, finding 5): one
PodDisruptionBudget per worker group keeps its minReplicas, a worker that is not Ready (it holds
no Serve replica, so it runs no proxy) is always evictable and never spends another pod's budget,
and a worker leaving asks Ray to drain its node first, within the request deadline."""

from __future__ import annotations

from typing import Any

from serving.config.ray_env import drain_deadline_s
from serving.k8s import chart as k8s_render
from serving.k8s.drain import STOP_MARGIN_S
from tests.k8s.conftest import Rendered, rendered


def budgets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}


def test_one_budget_per_group_keeps_its_minimum() -> None:
    specs = budgets(rendered("default").docs)
    assert set(specs) == {"llm-serving-gpu-workers", "llm-serving-cpu-workers"}
    for group, spec in (
        ("gpu", specs["llm-serving-gpu-workers"]),
        ("cpu", specs["llm-serving-cpu-workers"]),
    ):
        assert spec["minAvailable"] == 1 and "maxUnavailable" not in spec
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        labels = spec["selector"]["matchLabels"]
        assert labels["ray.io/group"] == group
        assert labels["app.kubernetes.io/component"] == "ray-worker"
        assert labels["app.kubernetes.io/instance"] == "llm-serving"


def test_a_group_without_a_minimum_has_no_budget() -> None:
    values = {
        "workers": {
            "cpu": {"minReplicas": 0, "replicas": 0},
            "gpu": {"minReplicas": 2, "replicas": 2},
        }
    }
    specs = budgets(k8s_render.render_documents(values))
    assert set(specs) == {"llm-serving-gpu-workers"}
    assert specs["llm-serving-gpu-workers"]["minAvailable"] == 2


def worker_pods(case: Rendered) -> list[dict[str, Any]]:
    cluster = case.one("RayService")["spec"]["rayClusterConfig"]
    return [group["template"]["spec"] for group in cluster["workerGroupSpecs"]]


def test_workers_drain_their_ray_node_before_they_stop(case: Rendered) -> None:
    deadline = drain_deadline_s(case.platform)
    for pod in worker_pods(case):
        hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert hook == ["python", "-m", "serving.k8s.drain", "--deadline-s", str(deadline)]
        assert pod["terminationGracePeriodSeconds"] == deadline + STOP_MARGIN_S


def test_the_drain_follows_the_request_deadline() -> None:
    docs = k8s_render.render_documents({"platform": {"limits": {"request_timeout_s": 99.5}}})
    (rayservice,) = [d for d in docs if d["kind"] == "RayService"]
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == "130"
        assert pod["terminationGracePeriodSeconds"] == 130 + STOP_MARGIN_S

"""The worker pods' preStop hook (serving.k8s.drain) finds its own Ray node among the GCS's and
knows when the node is drained; the GCS calls themselves need a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from serving.k8s.drain import autoscaler_pb2, is_idle, main, this_node

Status = autoscaler_pb2().NodeStatus


def node(name: str, ip: str, status: int = Status.RUNNING, **available: float) -> object:
    total = {"CPU": 4.0, "GPU": 1.0, "node:" + ip: 1.0}
    return autoscaler_pb2().NodeState(
        node_id=name.encode(),
        instance_id=name,
        node_ip_address=ip,
        status=status,
        total_resources=total,
        available_resources={"CPU": 4.0, "GPU": 1.0} | available,
    )


def name_of(state: Any) -> str:
    assert state is not None
    return str(state.instance_id)


def test_finds_the_pod_by_instance_id_then_by_ip() -> None:
    states = [node("head", "10.0.0.1"), node("gpu-a", "10.0.0.2"), node("gpu-b", "10.0.0.3")]
    assert name_of(this_node(states, "gpu-b", "10.0.0.2")) == "gpu-b"
    assert name_of(this_node(states, "", "10.0.0.2")) == "gpu-a"
    assert this_node(states, "gone", "10.0.0.9") is None


def test_a_dead_node_is_not_this_pod() -> None:
    """A pod restarted on the same IP: the old, dead node of that IP is never drained."""
    states = [node("old", "10.0.0.2", Status.DEAD), node("new", "10.0.0.2")]
    assert name_of(this_node(states, "", "10.0.0.2")) == "new"


def test_idle_once_every_resource_is_back() -> None:
    assert is_idle(node("a", "10.0.0.2"))  # node:<ip> is a marker, never "in use"
    assert not is_idle(node("a", "10.0.0.2", GPU=0.0))
    assert not is_idle(node("a", "10.0.0.2", CPU=3.0))


def test_a_failure_lets_the_pod_stop(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["--deadline-s", "5"]) == 1
    assert "drain failed" in capsys.readouterr().err

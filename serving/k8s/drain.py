"""The preStop hook of the chart's Ray worker pods: `python -m serving.k8s.drain --deadline-s N`.

A pod leaving (a node drain's eviction, a scale-down, an upgrade) first asks Ray's GCS to drain
its Ray node, as `ray drain-node` does (reason PREEMPTION: the node goes whatever it runs, by the
deadline): Serve starts the node's replicas on other nodes, then stops these once their requests
end. The hook waits until the node holds no resources, or the deadline, and returns; the kubelet
then stops Ray. The pod's terminationGracePeriodSeconds is the deadline + STOP_MARGIN_S.

In the pod, KubeRay sets RAY_ADDRESS (the head's GCS), RAY_CLOUD_INSTANCE_ID (the pod's name, which
the raylet reports as its node's instance id) and, with token auth, RAY_AUTH_TOKEN.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

# Seconds the kubelet leaves Ray to stop after the hook returns (within the grace period).
STOP_MARGIN_S = 30
POLL_S = 2.0
REASON = "DRAIN_NODE_REASON_PREEMPTION"


def this_node(states: Iterable[Any], instance_id: str, ip: str) -> Any | None:
    """This pod's node among the GCS's node states: by instance id (the pod name), else by IP."""
    states = [s for s in states if s.status != dead_status()]
    for state in states:
        if instance_id and state.instance_id == instance_id:
            return state
    return next((s for s in states if ip and s.node_ip_address == ip), None)


def is_idle(state: Any) -> bool:
    """Whether the node holds nothing: every resource back (`node:*` markers aside)."""
    available = dict(state.available_resources)
    return all(
        available.get(name, 0.0) >= total - 1e-6
        for name, total in state.total_resources.items()
        if not name.startswith("node:")
    )


def autoscaler_pb2() -> Any:
    """Ray's generated protobuf module (no stubs: its names are typed Any)."""
    return importlib.import_module("ray.core.generated.autoscaler_pb2")


def dead_status() -> int:
    return int(autoscaler_pb2().NodeStatus.DEAD)


def node_states(gcs: Any) -> list[Any]:
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    return list(get_cluster_resource_state(gcs).node_states)


def drain(deadline_s: int, poll_s: float = POLL_S) -> str:
    """Drain this pod's Ray node and wait until it is idle or gone; the outcome, in words."""
    import ray
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Cython module, no stubs

    gcs = GcsClient(address=os.environ["RAY_ADDRESS"])
    ip = ray.util.get_node_ip_address()
    node = this_node(node_states(gcs), os.environ.get("RAY_CLOUD_INSTANCE_ID", ""), ip)
    if node is None:
        return f"no live Ray node of this pod ({ip}): nothing to drain"
    node_id = node.node_id.hex()
    until = time.monotonic() + deadline_s
    accepted, refusal = gcs.drain_node(
        node_id,
        autoscaler_pb2().DrainNodeReason.Value(REASON),
        "the Kubernetes pod is stopping (preStop)",
        time.time_ns() // 1_000_000 + deadline_s * 1000,
    )
    if not accepted:
        return f"the GCS refused to drain node {node_id}: {refusal}"
    # The GCS's view of a node's resources lags its raylet by about a second: idle counts only
    # when seen twice, a poll apart (not a view from before a replica was placed).
    idle_polls = 0
    while time.monotonic() < until:
        time.sleep(poll_s)
        node = this_node(node_states(gcs), node.instance_id, node.node_ip_address)
        if node is None:
            return f"node {node_id} drained (gone)"
        idle_polls = idle_polls + 1 if is_idle(node) else 0
        if idle_polls >= 2:
            return f"node {node_id} drained"
    return f"node {node_id} still busy after {deadline_s} s: stopping anyway"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline-s", type=int, required=True, help="Longest wait for the drain.")
    args = parser.parse_args(argv)
    try:
        print(drain(args.deadline_s), flush=True)
    except Exception as err:  # noqa: BLE001  # any failure: say so (a FailedPreStopHook event), let the pod stop
        print(f"drain failed: {err!r}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

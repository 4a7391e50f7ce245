"""An in-memory Kubernetes API (kmock) with the resources the operator touches, and the operator
itself running against it in a thread (kopf.testing.KopfRunner)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import kopf
import pytest
import yaml
from kopf.testing import KopfRunner

from operators.spec import GROUP, KIND, PLURAL, VERSION

LLMSERVICES = f"{GROUP}/{VERSION}/{PLURAL}"
RAYSERVICES = "ray.io/v1/rayservices"
NETWORKPOLICIES = "networking.k8s.io/v1/networkpolicies"
BUDGETS = "policy/v1/poddisruptionbudgets"
CLAIMS = "v1/persistentvolumeclaims"
EVENTS = "v1/events"
NAMESPACE = "default"
VERBS = {"get", "list", "watch", "create", "patch", "delete"}
SYNC_INTERVAL_S = 0.3  # the status timer; 15 s in production


def declare_resources(k8s: Any) -> None:
    """What discovery must show: kopf scans the API for its resources and for its own backbone
    (namespaces, CRDs, events) before it starts watching."""
    info = kmock_lib.ResourceInfo
    k8s.resources[LLMSERVICES] = info(
        kind=KIND, namespaced=True, verbs=VERBS, subresources={"status"}
    )
    k8s.resources[RAYSERVICES] = info(
        kind="RayService", namespaced=True, verbs=VERBS, subresources={"status"}
    )
    k8s.resources[NETWORKPOLICIES] = info(kind="NetworkPolicy", namespaced=True, verbs=VERBS)
    k8s.resources[BUDGETS] = info(kind="PodDisruptionBudget", namespaced=True, verbs=VERBS)
    k8s.resources[CLAIMS] = info(kind="PersistentVolumeClaim", namespaced=True, verbs=VERBS)
    k8s.resources[EVENTS] = info(kind="Event", namespaced=True, verbs={"create"})
    k8s.resources["v1/namespaces"] = info(
        kind="Namespace", namespaced=False, verbs={"list", "watch"}
    )
    k8s.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"}
    )


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


@pytest.fixture
async def k8s(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """kmock as the current cluster of kopf and of the kubernetes client (via a kubeconfig)."""
    import kubernetes

    declare_resources(kmock)
    config = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))
    monkeypatch.setenv("KUBECONFIG", str(config))
    # The client reads $KUBECONFIG once, at import: point its default at the test's file too.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    # The operator scrapes each service's metrics: here from kmock (loopback), never cluster DNS.
    url = str(kmock.url).rstrip("/")
    monkeypatch.setenv("LLM_SERVING_OPERATOR_METRICS_URL", f"{url}/metrics/{{namespace}}/{{name}}")
    return kmock


@pytest.fixture
async def operator(k8s: Any) -> AsyncIterator[KopfRunner]:
    """`kopf run -m operators.llmservice` in a thread. The test's event loop serves kmock, so the
    runner's blocking enter and exit run in worker threads."""
    from operators import llmservice

    registry = kopf.OperatorRegistry()
    llmservice.register(registry, sync_interval_s=SYNC_INTERVAL_S)
    # --all-namespaces: kmock cannot list /api/v1/namespaces, which a namespaced kopf needs.
    args = ["run", "--standalone", "--all-namespaces", "--verbose", "-m", "operators.llmservice"]
    runner = KopfRunner(args, registry=registry, timeout=30)
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


def llmservice(name: str, spec: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    """An LLMService as the API server would store it (kmock fills in no metadata itself)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid or f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }


async def eventually(check: Callable[[], Any], what: str = "it", timeout_s: float = 60.0) -> Any:
    """Poll `check` until it returns something truthy; lookups that fail count as 'not yet'."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(AssertionError, KeyError, TypeError, IndexError, StopIteration):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)

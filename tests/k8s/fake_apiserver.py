"""A loopback stand-in for a Kubernetes API server: just enough discovery and one ConfigMap for
`helm template --dry-run=server` to run the chart's lookup-based KubeRay check for real."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NAMESPACE = "default"


def resource_list(group_version: str, kinds: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": plural,
                "singularName": "",
                "namespaced": True,
                "kind": kind,
                "verbs": ["get", "list"],
            }
            for plural, kind in kinds.items()
        ],
    }


# Every API group the chart renders into, besides core v1; ray.io only where KubeRay "runs".
GROUPS = {
    "apps/v1": {"daemonsets": "DaemonSet", "statefulsets": "StatefulSet"},
    "policy/v1": {"poddisruptionbudgets": "PodDisruptionBudget"},
    "networking.k8s.io/v1": {"ingresses": "Ingress", "networkpolicies": "NetworkPolicy"},
    "monitoring.coreos.com/v1": {"servicemonitors": "ServiceMonitor", "podmonitors": "PodMonitor"},
}
CORE = {
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "services": "Service",
    "persistentvolumeclaims": "PersistentVolumeClaim",
}


def group_entry(group_version: str) -> dict[str, Any]:
    name, version = group_version.split("/")
    entry = {"groupVersion": group_version, "version": version}
    return {"name": name, "versions": [entry], "preferredVersion": entry}


def routes(
    with_kuberay: bool,
    with_monitoring: bool = True,
    claims: dict[str, list[str]] | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, Any]]:
    groups = dict(GROUPS)
    if not with_monitoring:
        del groups["monitoring.coreos.com/v1"]
    if with_kuberay:
        groups["ray.io/v1"] = {"rayservices": "RayService"}
    table = {
        "/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.0"},
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/apis": {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [group_entry(g) for g in groups],
        },
        "/api/v1": resource_list("v1", CORE),
        f"/api/v1/namespaces/{NAMESPACE}/configmaps/kube-root-ca.crt": {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": "kube-root-ca.crt", "namespace": NAMESPACE},
            "data": {"ca.crt": "not a certificate"},
        },
    }
    for group_version, kinds in groups.items():
        table[f"/apis/{group_version}"] = resource_list(group_version, kinds)
    for name, modes in (claims or {}).items():  # existing PersistentVolumeClaims, by access modes
        table[f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{name}"] = {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"accessModes": modes},
        }
    for name, data in (secrets or {}).items():  # existing Secrets, their data base64-encoded
        table[f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}"] = {
            "kind": "Secret",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                # The release's own (Helm adopts it): an upgrade, not a stranger's Secret.
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": "llm-serving",
                    "meta.helm.sh/release-namespace": NAMESPACE,
                },
            },
            "data": data,
        }
    return table


def handler_for(table: dict[str, dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path in table:
                self.reply(200, table[path])
            elif path.endswith("/secrets"):  # Helm's release storage: no releases yet
                self.reply(
                    200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}
                )
            else:
                self.reply(
                    404,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "NotFound",
                        "code": 404,
                    },
                )

        def reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def kubeconfig_text(port: int) -> str:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: fake, user: {token: fake}}]\n"
        f"contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NAMESPACE}}}}}]\n"
    )


@contextmanager
def fake_cluster(
    tmp_path: Path,
    with_kuberay: bool,
    with_monitoring: bool = True,
    claims: dict[str, list[str]] | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
) -> Iterator[Path]:
    """Serve the fake API on a free loopback port; yields a kubeconfig pointing at it."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), handler_for(routes(with_kuberay, with_monitoring, claims, secrets))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(server.server_address[1]))
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

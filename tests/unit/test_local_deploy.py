"""`llm-serving up`/`apply`: the RayService's Serve config PUT to the dashboard (an app's args only
change with its own settings), a refused config or a failed app reported by its cause, replicas
draining on scale-down, and settings only a restart applies refused by `apply`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from serving.config import parse_config
from serving.config.ray_env import drain_deadline_s
from serving.local import platform as local
from tests.unit.loopback import free_port, serve_on_loopback

TRACEBACK = (
    "The deployment failed to start 1 times in a row. This may be due to a problem with its "
    "constructor or initial health check failing. See controller logs for details. Error:\n"
    'Traceback (most recent call last):\n  File "hf.py", line 195, in load\n    model = x()\n'
    "RuntimeError: Error(s) in loading state_dict: size mismatch for mlp.up_proj.weight\n\n"
)


def status(app_status: str, **deployments: tuple[str, str]) -> SimpleNamespace:
    return SimpleNamespace(
        status=app_status,
        message="Failed to update the deployments.",
        deployments={
            name: SimpleNamespace(status=s, message=m) for name, (s, m) in deployments.items()
        },
    )


def test_root_cause_is_the_exception_line() -> None:
    assert local.root_cause(TRACEBACK) == (
        "RuntimeError: Error(s) in loading state_dict: size mismatch for mlp.up_proj.weight"
    )
    assert local.root_cause("") == "no message"
    assert len(local.root_cause("x" * 5000)) == 400


def test_app_failures_name_each_failed_deployment_with_its_cause() -> None:
    apps = {
        "vllm": status("DEPLOY_FAILED", VLLMServer=("DEPLOY_FAILED", TRACEBACK)),
        "hf": status("DEPLOYING", HFBaseline=("UPDATING", "")),
        "analysis": status("RUNNING", Analysis=("HEALTHY", "")),
    }
    assert local.app_failures(apps) == [
        "vllm/VLLMServer: RuntimeError: Error(s) in loading state_dict: size mismatch for "
        "mlp.up_proj.weight"
    ]


def test_failed_app_without_failed_deployment_falls_back_to_the_app_message() -> None:
    apps = {"vllm": status("DEPLOY_FAILED", VLLMServer=("UNHEALTHY", ""))}
    assert local.app_failures(apps) == ["vllm: Failed to update the deployments."]


def test_replicas_drain_open_requests_before_they_stop() -> None:
    config = parse_config({"vllm": {"graceful_shutdown_timeout_s": 300}})
    options = config.vllm.replica_options(drain_deadline_s(config))
    assert options["graceful_shutdown_timeout_s"] == 300
    assert options["graceful_shutdown_wait_loop_s"] == 1.0
    # Unset: the drain deadline. Failed before: 120 s, which cut a stream still within its
    # 600 s request limit when its replica was scaled down or rolled.
    config = parse_config({"limits": {"request_timeout_s": 900}})
    assert config.hf.replica_options(drain_deadline_s(config))["graceful_shutdown_timeout_s"] == 930


# -- deploying and re-deploying: the RayService's Serve config, PUT to the dashboard -------------


def deployed_document(config, monkeypatch) -> dict:
    """The document `local.deploy` sends, captured instead of PUT (no Ray here)."""
    sent: dict = {}
    monkeypatch.setattr(local, "put_serve_config", lambda url, doc, timeout_s: sent.update(doc))
    monkeypatch.setattr(local, "wait_deployed", lambda names, timeout_s: None)
    local.deploy(config)
    return sent


def vllm_entry(document: dict) -> dict:
    return next(app for app in document["applications"] if app["name"] == "vllm")


def test_local_deploy_sends_the_rayservice_serve_config(monkeypatch) -> None:
    from serving.k8s.serve_config import CPU_WORKER_RESOURCE, serve_config, serve_config_v2

    config = parse_config({"http": {"port": 8123}, "vllm": {"autoscaling": {"max_replicas": 2}}})
    document = deployed_document(config, monkeypatch)
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8123}  # loopback here
    assert document["applications"] == serve_config(config, "0.0.0.0")["applications"]
    # The RayService's apps, but for the CPU worker group's resource: one local node has none.
    assert CPU_WORKER_RESOURCE in json.dumps(serve_config_v2(config)["applications"])
    assert CPU_WORKER_RESOURCE not in json.dumps(document["applications"])


@pytest.mark.parametrize(
    "change",
    [
        {"analysis": {"enabled": False}},
        {"hf": {"mode": "kv-cache"}},
        {"vllm": {"autoscaling": {"max_replicas": 3}}},
        {"vllm": {"max_ongoing_requests": 64}},
    ],
    ids=["analysis-off", "hf-mode", "max-replicas", "max-ongoing"],
)
def test_a_change_outside_vllms_args_keeps_its_args(monkeypatch, change: dict) -> None:
    """Serve restarts an app only when its import path or args change."""
    base = {"vllm": {"autoscaling": {"max_replicas": 2}}}
    merged = {**base, **change} if "vllm" not in change else change
    before = vllm_entry(deployed_document(parse_config(base), monkeypatch))["args"]
    after = vllm_entry(deployed_document(parse_config(merged), monkeypatch))["args"]
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)


def test_an_engine_change_is_in_vllms_args(monkeypatch) -> None:
    before = vllm_entry(deployed_document(parse_config({}), monkeypatch))["args"]
    changed = parse_config({"vllm": {"engine": {"max_num_seqs": 8}}})
    assert vllm_entry(deployed_document(changed, monkeypatch))["args"] != before


class Dashboard:
    """A stand-in for Serve's REST API on the dashboard: answers from a script, records bodies."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route

        self.bodies: list[dict] = []

        async def put(request: Request) -> PlainTextResponse:
            self.bodies.append(await request.json())
            status, text = answers.pop(0) if len(answers) > 1 else answers[0]
            return PlainTextResponse(text, status_code=status)

        self.app = Starlette(routes=[Route("/api/serve/applications/", put, methods=["PUT"])])


def test_put_waits_for_the_dashboard_then_sends_the_document() -> None:
    dashboard = Dashboard([(503, "starting"), (200, "")])
    with serve_on_loopback(dashboard.app) as url:
        local.put_serve_config(url, {"applications": []}, timeout_s=30)
    assert dashboard.bodies == [{"applications": []}, {"applications": []}]


def test_a_refused_config_is_one_line_with_serves_reason() -> None:
    refusal = (
        "Traceback (most recent call last):\n  ...\nValueError: route_prefix must start with /"
    )
    with (
        serve_on_loopback(Dashboard([(400, refusal)]).app) as url,
        pytest.raises(local.PlatformError) as err,
    ):
        local.put_serve_config(url, {}, timeout_s=30)
    assert str(err.value) == (
        "deployment failed: Serve refused the config: ValueError: route_prefix must start with /"
    )


def test_no_dashboard_is_an_error_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(local.PlatformError, match=f"Ray's dashboard at {url} took no config"):
        local.put_serve_config(url, {}, timeout_s=0)


def test_apply_refuses_what_only_a_restart_changes() -> None:
    running = local.endpoints(parse_config({}))
    local.check_applicable(running, parse_config({"vllm": {"autoscaling": {"max_replicas": 3}}}))
    with pytest.raises(local.PlatformError, match="^changed http, ray: "):
        local.check_applicable(running, parse_config({"http": {"port": 9}, "ray": {"num_cpus": 2}}))


def test_only_serves_haproxy_is_stopped_with_ray() -> None:
    """Failed before: a failed `up` stopped Ray without Serve, and its HAProxy kept ports 8404 and
    9101, so the next platform's HAProxy could not bind ("Some protocols failed to start")."""
    from serving.local.leftovers import is_serve_haproxy

    serve_config = ["haproxy", "-db", "-f", "/tmp/haproxy-serve/abc/haproxy.cfg", "-sf", "617"]
    assert is_serve_haproxy("haproxy", serve_config, "/tmp/haproxy-serve")
    assert not is_serve_haproxy("haproxy", ["haproxy", "-f", "/etc/haproxy/haproxy.cfg"])
    assert not is_serve_haproxy("python", serve_config, "/tmp/haproxy-serve")

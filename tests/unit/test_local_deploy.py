"""`llm-serving up`'s deployment wait: a failed app's cause is the replica's exception line, and
replicas drain their requests on scale-down (Serve's graceful-shutdown options from config)."""

from __future__ import annotations

from types import SimpleNamespace

from serving import local
from serving.config import parse_config

TRACEBACK = (
    "The deployment failed to start 1 times in a row. This may be due to a problem with its "
    "constructor or initial health check failing. See controller logs for details. Error:\n"
    "Traceback (most recent call last):\n  File \"hf.py\", line 195, in load\n    model = x()\n"
    "RuntimeError: Error(s) in loading state_dict: size mismatch for mlp.up_proj.weight\n\n"
)


def status(app_status: str, **deployments: tuple[str, str]) -> SimpleNamespace:
    return SimpleNamespace(
        status=app_status, message="Failed to update the deployments.",
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
    options = config.vllm.replica_options()
    assert options["graceful_shutdown_timeout_s"] == 300
    assert options["graceful_shutdown_wait_loop_s"] == 1.0
    # The default outlasts Serve's own 20 s, which would cut long generations.
    assert parse_config({}).hf.replica_options()["graceful_shutdown_timeout_s"] == 120.0

"""Where Serve puts a deployment's replica count when its options change, driven through Ray's own
autoscaling state with the options the platform writes (AutoscalingSettings.serve_options)."""

from __future__ import annotations

import warnings

import pytest
from pydantic import ValidationError
from ray.serve._private.autoscaling_state import DeploymentAutoscalingState
from ray.serve._private.common import DeploymentID
from ray.serve._private.config import DeploymentConfig, ReplicaConfig
from ray.serve._private.deployment_info import DeploymentInfo

from serving.config.replica import AutoscalingSettings


def deployment(settings: AutoscalingSettings) -> DeploymentInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # metrics_interval_s's notice
        config = DeploymentConfig(autoscaling_config=settings.serve_options())
    return DeploymentInfo(
        deployment_config=config,
        replica_config=ReplicaConfig.create(lambda: None),
        start_time_ms=0,
        deployer_job_id="test",
        version="v1",
    )


def target_after_change(before: AutoscalingSettings, after: AutoscalingSettings, live: int) -> int:
    """Serve's target once `after` replaces `before` on a deployment running `live` replicas."""
    state = DeploymentAutoscalingState(DeploymentID(name="vllm", app_name="vllm"))
    state.register(deployment(before), 0)
    return state.register(deployment(after), live)


def test_an_in_place_change_keeps_the_live_replicas() -> None:
    """Failed before: every autoscaled deployment carried initial_replicas = max(min, 1), and Serve
    resets the target to it on any option change, so raising max_replicas of a deployment serving
    on 4 replicas dropped it to 1."""
    before = AutoscalingSettings(min_replicas=1, max_replicas=4)
    after = AutoscalingSettings(min_replicas=1, max_replicas=6)
    assert target_after_change(before, after, live=4) == 4


def test_a_new_deployment_starts_at_initial_replicas() -> None:
    """What the operator sets for a new RayCluster: the live count, not min_replicas."""
    state = DeploymentAutoscalingState(DeploymentID(name="vllm", app_name="vllm"))
    started = AutoscalingSettings(min_replicas=1, max_replicas=8, initial_replicas=4)
    assert state.register(deployment(started), 0) == 4


def test_scale_to_zero_still_starts_with_one_replica() -> None:
    state = DeploymentAutoscalingState(DeploymentID(name="vllm", app_name="vllm"))
    assert state.register(deployment(AutoscalingSettings(min_replicas=0, max_replicas=2)), 0) == 1


@pytest.mark.parametrize("initial", [0, 5])
def test_initial_replicas_outside_the_bounds_is_refused(initial: int) -> None:
    with pytest.raises(ValidationError, match="initial_replicas must lie between"):
        AutoscalingSettings(min_replicas=1, max_replicas=4, initial_replicas=initial)

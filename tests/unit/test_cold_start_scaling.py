"""The autoscaler knows a cold start is coming (issue 37, point 4), driven through Ray's own
DeploymentAutoscalingState with the options the platform writes (AutoscalingSettings.serve_options)
and handle reports on the wire format the controller decodes.

What Ray 2.60 does, and these tests keep: a handle that queues a request while its deployment has
no replica pushes its report at once (router.py, should_send_scaled_to_zero_optimized_push), and
the policy's cold-start path (autoscaling_policy._get_cold_start_scale_up_replicas) scales from
zero on it, before upscale_delay_s. While the replica starts it counts as no running replica, and
that path keeps the target where it is (max(ceil(upscaling_factor), target)): a burst at zero
starts one replica, however many requests wait. More follow once it serves, on the averaged load,
after upscale_delay_s and never past max_replicas."""

from __future__ import annotations

import time

import pytest
from ray.serve._private import autoscaling_metrics_codec as codec
from ray.serve._private.autoscaling_state import DeploymentAutoscalingState
from ray.serve._private.common import (
    RUNNING_REQUESTS_KEY,
    DeploymentHandleSource,
    DeploymentID,
    HandleMetricReport,
    ReplicaID,
    TimeStampedValue,
)

from serving.config.replica import AutoscalingSettings
from tests.unit.test_start_replicas import deployment

VLLM = DeploymentID(name="vllm", app_name="vllm")
FIRST = ReplicaID(unique_id="first", deployment_id=VLLM)


def scaling(**fields: float) -> AutoscalingSettings:
    """Scale to zero, up to 4 replicas of 8 requests each."""
    settings: dict[str, float] = {"min_replicas": 0, "max_replicas": 4, "target_queue_depth": 8}
    return AutoscalingSettings.model_validate(settings | fields)


def at_zero(settings: AutoscalingSettings) -> DeploymentAutoscalingState:
    """A deployment that went to zero: registered, then decided down with no load."""
    state = DeploymentAutoscalingState(VLLM)
    state.register(deployment(settings), 0)
    assert state.get_decision_num_replicas(0) == 0
    return state


def hold(state: DeploymentAutoscalingState, queued: int, running: dict[ReplicaID, int]) -> None:
    """A Serve proxy's handle report (`queued` waiting there, `running` sent to each replica),
    encoded and recorded as the controller does (record_autoscaling_metrics_from_handle)."""
    now = time.time()
    per_replica = {r.to_full_id_str(): [TimeStampedValue(now, n)] for r, n in running.items()}
    report = HandleMetricReport(
        deployment_id=VLLM,
        handle_id="proxy-handle",
        actor_id="proxy-actor",
        handle_source=DeploymentHandleSource.PROXY,
        queued_requests=[TimeStampedValue(now, queued)],
        metrics={RUNNING_REQUESTS_KEY: per_replica},
        timestamp=now,
    )
    payload = codec.encode(report)
    if codec.is_columnar(payload):
        state.record_columnar_metrics_for_handle(codec.decode_handle_flat(payload))
    else:
        state.record_request_metrics_for_handle(report)


@pytest.mark.parametrize("upscale_delay_s", [0.0, 2.0, 3600.0])
def test_the_first_held_request_starts_a_replica_at_once(upscale_delay_s: float) -> None:
    """No upscale_delay_s of averaged load from zero, whatever the platform's delay."""
    state = at_zero(scaling(upscale_delay_s=upscale_delay_s))
    hold(state, queued=1, running={})
    assert state.get_decision_num_replicas(0) == 1


def test_a_burst_at_zero_starts_one_replica_while_it_loads() -> None:
    """100 requests at zero would want 13 replicas of 8: Serve starts one, and keeps the target
    at one on every decision while that replica is still starting (not running)."""
    state = at_zero(scaling(upscale_delay_s=0))
    hold(state, queued=100, running={})
    decisions = [state.get_decision_num_replicas(0)]
    for _ in range(5):
        hold(state, queued=100, running={})
        decisions.append(state.get_decision_num_replicas(decisions[-1]))
    assert decisions == [1] * 6


def test_once_the_first_serves_the_burst_scales_up_to_max_replicas() -> None:
    state = at_zero(scaling(upscale_delay_s=0))
    hold(state, queued=100, running={})
    assert state.get_decision_num_replicas(0) == 1
    state.update_running_replica_ids([FIRST])
    hold(state, queued=92, running={FIRST: 8})
    assert state.get_decision_num_replicas(1) == 4  # 13 wanted, max_replicas 4


def test_past_zero_upscale_delay_s_still_holds() -> None:
    """The cold-start path is only for zero: with a replica serving, the delay applies."""
    state = at_zero(scaling(upscale_delay_s=3600))
    hold(state, queued=100, running={})
    assert state.get_decision_num_replicas(0) == 1
    state.update_running_replica_ids([FIRST])
    hold(state, queued=92, running={FIRST: 8})
    assert state.get_decision_num_replicas(1) == 1


def test_no_request_no_replica() -> None:
    state = at_zero(scaling())
    hold(state, queued=0, running={})
    assert state.get_decision_num_replicas(0) == 0


def test_downscale_to_zero_delay_s_reaches_serve() -> None:
    options = scaling(downscale_delay_s=20, downscale_to_zero_delay_s=600).serve_options()
    config = deployment(scaling(downscale_to_zero_delay_s=600)).deployment_config
    assert options["downscale_to_zero_delay_s"] == 600
    assert config.autoscaling_config.downscale_to_zero_delay_s == 600


def test_downscale_to_zero_delay_s_unset_is_serves_default() -> None:
    """Unset, nothing is written: Serve then uses downscale_delay_s for 1 -> 0."""
    assert "downscale_to_zero_delay_s" not in scaling().serve_options()
    config = deployment(scaling()).deployment_config.autoscaling_config
    assert config.downscale_to_zero_delay_s is None

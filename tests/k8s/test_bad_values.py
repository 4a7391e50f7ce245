"""Bad values fail the render with a message that names the value and says what to do.
Wrong types and ranges are values.schema.json's (generated from PlatformConfig for `platform`);
cross-field rules are the chart's validateValues, which reports every problem at once."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serving.config import PlatformConfig
from serving.k8s import chart as k8s_render

# The chart's single-model platform.vllm defaults, nulled as a multi-model release must.
NO_VLLM_DEFAULTS = {"vllm": {key: None for key in ("autoscaling", "resources", "engine", "args")}}

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "negative worker replicas",
        {"workers": {"gpu": {"minReplicas": -1}}},
        ["/workers/gpu/minReplicas", "minimum"],
    ),
    (
        "negative serve replicas",
        {"platform": {"vllm": {"num_replicas": -1}}},
        ["/platform/vllm/num_replicas", "minimum"],
    ),
    (
        "no model",
        {"platform": {"model": {"ref": ""}}},
        ["platform.model.ref: no model is set", "Hugging Face id"],
    ),
    (
        "GPU count 0 on the GPU group",
        {"workers": {"gpu": {"gpusPerWorker": 0}}},
        ["workers.gpu.gpusPerWorker: is 0, must be at least 1", "workers.gpu.enabled=false"],
    ),
    (
        "unknown platform key",
        {"platform": {"vllm": {"max_replica": 2}}},
        ["/platform/vllm", "'max_replica' not allowed"],
    ),
    ("unknown chart key", {"worker": {}}, ["'worker' not allowed"]),
    (
        "Ray token auth on a Ray without it",
        {"ray": {"version": "2.51.0"}},
        ["ray.auth.mode: token needs Ray >= 2.52.0", "ray.version is 2.51.0"],
    ),
    ("unknown Ray auth mode", {"ray": {"auth": {"mode": "on"}}}, ["/ray/auth/mode"]),
    (
        "models beside the single-model vllm defaults",
        {"platform": {"models": [{"name": "a"}]}},
        [
            "platform.vllm.autoscaling: with platform.models each model sets its own; set "
            "platform.vllm.autoscaling to null",
            "platform.vllm.engine:",
        ],
    ),
    (
        "a model and an adapter of the same name",
        {
            "platform": {
                **NO_VLLM_DEFAULTS,
                "models": [
                    {"name": "a"},
                    {"name": "b", "adapters": [{"name": "a", "path": "demo:a"}]},
                ],
            }
        },
        ['platform.models[1] (b): the name "a" is already taken by models[0]'],
    ),
    (
        "a model's autoscaling bounds",
        {
            "platform": {
                **NO_VLLM_DEFAULTS,
                "models": [{"name": "a", "autoscaling": {"min_replicas": 3, "max_replicas": 2}}],
            }
        },
        ["platform.models[0].autoscaling: min_replicas (3) must not exceed max_replicas (2)"],
    ),
    (
        "more GPU replicas of models than GPUs",
        {
            "platform": {
                **NO_VLLM_DEFAULTS,
                "models": [
                    {"name": "a", "resources": {"accelerator": "gpu"}, "num_replicas": 3},
                    {
                        "name": "b",
                        "resources": {"accelerator": "gpu"},
                        "autoscaling": {"max_replicas": 2},
                    },
                ],
            }
        },
        ["Serve may run 5 GPU replica(s)", "= 4"],
    ),
    (
        "wrong accelerator",
        {"platform": {"vllm": {"resources": {"accelerator": "tpu"}}}},
        ["/platform/vllm/resources/accelerator"],
    ),
    (
        "rayStartParams must be strings",
        {"head": {"rayStartParams": {"num-cpus": 0}}},
        ["/head/rayStartParams/num-cpus", "string"],
    ),
    (
        "more GPU replicas than GPUs",
        {"platform": {"vllm": {"autoscaling": {"max_replicas": 9}}}},
        ["Serve may run 9 GPU replica(s)", "= 4"],
    ),
    (
        "GPU apps without a GPU group",
        {"workers": {"gpu": {"enabled": False}, "cpu": {"enabled": True}}},
        ["accelerator=gpu need 4 GPU(s), but workers.gpu.enabled=false"],
    ),
    (
        "every app on the GPU counts, each at its most replicas",
        {
            "workers": {"gpu": {"enabled": False}, "cpu": {"enabled": True}},
            "platform": {
                "hf": {"resources": {"accelerator": "gpu"}, "num_replicas": 2},
                "analysis": {"resources": {"accelerator": "gpu"}},
            },
        },
        ["accelerator=gpu need 7 GPU(s), but workers.gpu.enabled=false"],
    ),
    (
        "no worker group",
        {
            "workers": {"gpu": {"enabled": False}, "cpu": {"enabled": False}},
            "platform": {"vllm": {"resources": {"accelerator": "cpu"}}},
        },
        ["workers: no worker group is enabled"],
    ),
    (
        "replicas outside bounds",
        {"workers": {"gpu": {"replicas": 5}}},
        ["workers.gpu: need minReplicas <= replicas <= maxReplicas, got 1 <= 5 <= 4"],
    ),
    (
        "autoscaling bounds",
        {"platform": {"vllm": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}},
        ["platform.vllm.autoscaling: min_replicas (3) must not exceed max_replicas (2)"],
    ),
    (
        "duplicate route prefix",
        {"platform": {"hf": {"route_prefix": "/"}}},
        ['platform.hf.route_prefix: "/" is already the prefix of vllm'],
    ),
    (
        "route prefix without slash",
        {"platform": {"analysis": {"route_prefix": "analysis"}}},
        ["platform.analysis.route_prefix: \"analysis\" must start with '/'"],
    ),
]


def render_error(values: dict[str, Any]) -> str:
    with pytest.raises(k8s_render.RenderError) as caught:
        k8s_render.render_templates(values)
    return str(caught.value)


@pytest.mark.parametrize(("values", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_with_a_readable_message(values: dict[str, Any], expected: list[str]) -> None:
    message = render_error(values)
    for fragment in expected:
        assert fragment in message


def test_every_problem_is_reported_at_once() -> None:
    message = render_error(
        {
            "platform": {"model": {"ref": " "}},
            "workers": {"gpu": {"gpusPerWorker": 0, "replicas": 7}},
        }
    )
    assert message.count("\n- ") == 3


@pytest.mark.parametrize(
    "platform",
    [
        {"vllm": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}},
        {"hf": {"route_prefix": "/"}},
        {"analysis": {"route_prefix": "analysis"}},
        {"vllm": {"num_replicas": 0}},
        {"models": [{"name": "a"}]},
        {**NO_VLLM_DEFAULTS, "models": [{"name": "a"}, {"name": "a"}]},
        {**NO_VLLM_DEFAULTS, "models": [{"name": "a", "autoscaling": {"min_replicas": 2}}]},
    ],
)
def test_chart_rejects_what_platform_config_rejects(platform: dict[str, Any]) -> None:
    """The chart's checks and PlatformConfig agree, so nothing invalid reaches the cluster."""
    with pytest.raises(ValidationError):
        PlatformConfig.model_validate(k8s_render.merged_values({"platform": platform})["platform"])
    render_error({"platform": platform})

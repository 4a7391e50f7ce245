"""Queue-depth autoscaling on the CPU, per model: two models behind one endpoint (the model
router), each autoscaling on its own; `llm-serving bench autoscale` sends a step burst
to one of them, which goes from 1 to 2 replicas and, after the load ends, back to 1, with every
request answered (completed, or refused with 503 + Retry-After), while the other model keeps its
one replica. Bounded in count and time; the times are reported, not asserted."""

from __future__ import annotations

import json
from pathlib import Path

from serving.config import PlatformConfig, parse_config
from serving.deployments.model_router import build_router_app
from serving.deployments.vllm_server import build_vllm_app
from tests.integration.conftest import Platform, extra_apps, run_cli

APP, PREFIX = "autoscale", "/autoscale"
BURST, CALM = "burst", "calm"


def tiny_model(name: str) -> dict:
    return {
        "name": name,
        "model": {"ref": "tiny-qwen2", "max_model_len": 1024, "dtype": "float32"},
        # One core per replica (num_cpus 1): the second replica starts beside a busy first one.
        # The engine core in the replica: no second torch + vLLM import in a child process.
        "engine": {
            "kv_cache_memory_gb": 0.25,
            "max_num_seqs": 8,
            "cpu_threads": 1,
            "engine_core": "inprocess",
        },
        "autoscaling": {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_queue_depth": 4,
            "upscale_delay_s": 1,
            "downscale_delay_s": 8,
            "look_back_period_s": 2,
        },
    }


def autoscaling_config() -> dict:
    return {"vllm": {"route_prefix": PREFIX}, "models": [tiny_model(BURST), tiny_model(CALM)]}


def applications(config: PlatformConfig) -> list[tuple[str, str | None, object]]:
    """Each model's app (no route: the router reaches it by handle), then the router."""
    models = [
        (entry.app_name, None, build_vllm_app(config.model_platform(entry), behind_router=True))
        for entry in config.models
    ]
    return [*models, (APP, PREFIX, build_router_app(config))]


def timeline_text(document: dict) -> str:
    """The replica timeline (with Serve's target) for a failure message."""
    rows = document["timeline"]["replicas"]
    return f"{document['timeline']['replicas_columns']}\n" + "\n".join(map(str, rows))


def test_a_burst_on_one_model_scales_it_alone_up_to_two_replicas_and_back(
    platform: Platform, tmp_path: Path
) -> None:
    config = parse_config(autoscaling_config())
    with extra_apps(applications(config)):
        done = run_cli(
            "bench",
            "autoscale",
            "--target",
            f"autoscale={platform.url}{PREFIX}/v1#{BURST}",
            "--dashboard",
            platform.dashboard_url,
            "--concurrency",
            "24",
            "--requests",
            "600",
            "--duration",
            "400",
            "--input-len",
            "16",
            "--output-len",
            "200",
            "--output",
            str(tmp_path),
            timeout=1200,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "result.json").read_text())
    fig, requests, replicas = (
        document["figures"],
        document["requests"],
        document["timeline"]["replicas"],
    )
    assert (document["application"], document["deployment"]) == (f"vllm-{BURST}", "VLLMServer")
    calm = document["other_deployments"][f"vllm-{CALM}/VLLMServer"]
    assert calm == {"min_running": 1, "max_running": 1, "max_target": 1}, document[
        "other_deployments"
    ]
    assert replicas and replicas[0][1] == 1, timeline_text(document)  # one RUNNING at the start
    assert fig["second_replica_serving_s"] is not None, (
        f"never 2 replicas:\n{timeline_text(document)}"
    )
    assert fig["back_to_one_s"] is not None, f"never back to 1:\n{timeline_text(document)}"
    assert requests["failed"] == 0, requests
    assert requests["completed"] > 0
    assert requests["completed"] + requests["refused_with_retry_after"] == requests["sent"]
    assert max(row[1] for row in document["timeline"]["queue"]) > 0  # in flight during the step
    assert (tmp_path / "timeline.png").stat().st_size > 0
    print(f"\n{done.stdout.strip()}\nstart-up of the replicas: {document['replica_startup_s']}")

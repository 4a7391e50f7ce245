"""Server-side evidence sources and the peer command line (no server, no model)."""

from __future__ import annotations

from pathlib import Path

from serving.config import PlatformConfig
from serving.loadgen import peers, server_stats
from serving.loadgen.client import Target

PROMETHEUS_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
"""


def test_gauges_are_summed_over_label_sets() -> None:
    sums = server_stats.gauge_sums(
        PROMETHEUS_TEXT, {"vllm:num_requests_running", "vllm:num_requests_waiting"}
    )
    assert sums == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 7.0}
    # a metric whose name only starts like a wanted one is not added in
    longer = PROMETHEUS_TEXT + "vllm:num_requests_running_max 40.0\n"
    assert server_stats.gauge_sums(longer, {"vllm:num_requests_running"}) == {
        "vllm:num_requests_running": 5.0
    }


def test_summary_says_whether_batching_happened() -> None:
    samples = [
        server_stats.Sample(0.0, 1, 0),
        server_stats.Sample(0.1, 4, 2),
        server_stats.Sample(0.2, 2, 0),
    ]
    summary = server_stats.summarize_samples("health", samples)
    assert (summary["max_running"], summary["max_waiting"], summary["batching"]) == (4, 2, True)
    assert summary["timeline"][1] == [0.1, 4, 2]
    alone = server_stats.summarize_samples("health", [server_stats.Sample(0.0, 1, 3)])
    assert alone["batching"] is False
    silent = server_stats.summarize_samples(None, [])
    assert silent["batching"] is None and silent["max_running"] is None
    # Polls that only saw an idle engine missed the load: no verdict, not "no batching".
    missed = server_stats.summarize_samples("health", [server_stats.Sample(0.0, 0, 0)] * 2)
    assert missed["batching"] is None and missed["max_running"] == 0


def test_timeline_is_thinned_but_shifted_exactly() -> None:
    samples = [server_stats.Sample(i * 0.01, 1, 0) for i in range(1000)]
    assert len(server_stats.thin(samples, 100)) == 100
    assert server_stats.shifted(samples[:1], 2.5)[0].t == 2.5


def test_target_origin_is_where_health_lives() -> None:
    assert Target("hf", "http://127.0.0.1:8000/hf/v1").origin == "http://127.0.0.1:8000/hf"
    assert Target("v", "http://127.0.0.1:8000/v1/").origin == "http://127.0.0.1:8000"


def test_peer_gets_the_platforms_engine_arguments() -> None:
    config = PlatformConfig.model_validate(
        {
            "model": {"ref": "tiny-qwen2", "max_model_len": 1024, "dtype": "float32"},
            "vllm": {"engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 32}},
        }
    )
    command = peers.vllm_peer_command(config, Path("/models/tiny"), "tiny-qwen2", 9999)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(command)
    for flag in (
        "--host 127.0.0.1",
        "--port 9999",
        "--model /models/tiny",
        "--served-model-name tiny-qwen2",
        "--dtype float32",
        "--max-model-len 1024",
        "--max-num-seqs 32",
        f"--kv-cache-memory-bytes {int(0.25 * 1024**3)}",
        "--distributed-executor-backend uni",
        "--enforce-eager",
    ):
        assert flag in joined
    assert "--max-num-batched-tokens" not in joined  # unset: vLLM's own default, as the platform


def test_engine_cli_args_flags() -> None:
    assert peers.engine_cli_args({"a_b": True, "c": False, "d": None, "e": [1, 2], "f": 0.5}) == [
        "--a-b",
        "--e",
        "1",
        "2",
        "--f",
        "0.5",
    ]

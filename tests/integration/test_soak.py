"""A short soak (`llm-serving bench soak`) on the test platform: steady load for 75 s,
every Serve replica's memory sampled, no replica growing beyond the bound after warm-up, nothing
failed; the report carries the figures. The long run is documented in
docs/benchmarks/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import Platform, run_cli

DURATION_S, WARMUP_S, BOUND_MB = 75, 25, 200


def test_short_soak_holds_replica_memory(platform: Platform, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    done = run_cli(
        "bench",
        "soak",
        "--target",
        f"platform={platform.api}",
        "--dashboard",
        platform.dashboard_url,
        "--duration",
        str(DURATION_S),
        "--warmup",
        str(WARMUP_S),
        "--max-growth-mb",
        str(BOUND_MB),
        "--concurrency",
        "4",
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--output",
        str(out),
        timeout=600,
    )
    print(f"\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads((out / "result.json").read_text())
    requests = document["requests"]
    assert requests["completed"] > 0 and requests["failed"] == 0, requests
    replicas = {r["replica"].split("/")[1]: r for r in document["replicas"]}
    assert {"VLLMServer", "HFBaseline"} <= set(replicas)  # every app's replicas are sampled
    vllm = replicas["VLLMServer"]
    # The engine core lives in a child process: a replica with it weighs far more than Python alone.
    assert vllm["after_warmup_mb"] > 500, vllm
    assert vllm["samples"] >= DURATION_S // 2 and vllm["growth_mb"] <= BOUND_MB, vllm
    assert document["memory_held"] and document["passed"]
    assert (out / "memory.png").stat().st_size > 10_000
    assert "| VLLMServer" not in (out / "summary.md").read_text()  # rows name app/deployment/id
    assert "vllm/VLLMServer/" in (out / "summary.md").read_text()

"""`llm-serving conformance` against the platform and plain vLLM's own server on the same model
with the same engine and server options: every case plain vLLM passes must pass through the
platform (a `vllm serve` user loses nothing by switching)."""

from __future__ import annotations

import json
from pathlib import Path

from serving.config import PlatformConfig, load_config
from serving.loadgen.peers import VLLM_PEER_NAME, vllm_peer, vllm_peer_command
from tests.integration.conftest import Platform, platform_config, run_cli

# What the comparison needs the peer to pass, so that it is not vacuous: cases that hold for the
# tiny random-weight model on plain vLLM (the tool cases need the server's tool flags).
PEER_MUST_PASS = (
    "logprobs + top_logprobs (chat)",
    "echo + prompt logprobs",
    "response_format json_schema (parse)",
    "tool message in history",
    "/v1/responses",
    "/tokenize -> /detokenize round trip",
)


def test_peer_gets_the_platform_vllm_server_flags() -> None:
    config = PlatformConfig.model_validate(platform_config(8000, 8265, 8080))
    command = vllm_peer_command(config, Path("/models/tiny"), "tiny-qwen2", 8001)
    assert "--enable-auto-tool-choice" in command
    assert command[command.index("--tool-call-parser") + 1] == "hermes"


def test_platform_passes_every_case_plain_vllm_passes(platform: Platform, tmp_path: Path) -> None:
    config = load_config(str(platform.config_path))
    with vllm_peer(config, platform.model, tmp_path / "vllm-peer.log") as peer:
        done = run_cli(
            "conformance",
            "--target",
            f"{VLLM_PEER_NAME}={peer.base_url}",
            "--target",
            f"platform={platform.api}",
            "--model",
            platform.model,
            "--require-superset",
            VLLM_PEER_NAME,
            "--output",
            str(tmp_path / "report"),
            "--timeout",
            "60",
            timeout=900,
        )
    report = json.loads((tmp_path / "report" / "conformance.json").read_text())
    peer_ok = {
        r["case"]
        for r in report["results"]
        if r["target"] == VLLM_PEER_NAME and r["status"] == "ok"
    }
    assert set(PEER_MUST_PASS) <= peer_ok, (
        f"plain vLLM fails {set(PEER_MUST_PASS) - peer_ok}\n{done.stdout}"
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "| feature | vllm-serve | platform |" in done.stdout

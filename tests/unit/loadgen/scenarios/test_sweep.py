"""`llm-serving bench` end to end against fake engines behind the real OpenAI routes, served by
uvicorn on loopback (no Ray, no model): the client, the interleaving, the server-side polling, the
report files, `--require` and the one-line errors."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fastapi import FastAPI

from serving.api.routes import build_openai_app
from serving.cli import main
from serving.config import parse_config
from serving.engines.base import Delta, SamplingSpec
from serving.loadgen import peers
from tests.unit.fake_engine import FakeEngine
from tests.unit.loopback import free_port, serve_on_loopback


class FlakyEngine(FakeEngine):
    """Every second request fails once its stream has started (an engine error mid-stream)."""

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec
    ) -> AsyncIterator[Delta]:
        if len(self.started) % 2:
            self.started.append(request_id)
            raise RuntimeError("engine fell over")
        async for delta in super().generate(request_id, prompt_token_ids, sampling):
            yield delta


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """fast at /, slow at /slow, flaky at /flaky; the fakes count what they run at once."""
    app = FastAPI()
    app.mount("/slow", build_openai_app(FakeEngine(delay_s=0.02)))
    app.mount("/flaky", build_openai_app(FlakyEngine(delay_s=0.001)))
    app.mount("/", build_openai_app(FakeEngine(delay_s=0.01)))
    with serve_on_loopback(app) as url:
        yield url


def bench(*args: str) -> Result:
    return CliRunner().invoke(main, ["bench", "sweep", *args])


def small_run(server: str, out: Path, *extra: str) -> Result:
    return bench(
        "--target",
        f"fast={server}/v1",
        "--target",
        f"slow={server}/slow/v1",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--input-len",
        "6",
        "--output-len",
        "6",
        "--stats-interval",
        "0.005",
        "--output",
        str(out),
        *extra,
    )


def test_comparison_run_writes_vllm_style_results(server: str, tmp_path: Path) -> None:
    run = small_run(server, tmp_path, "--slo", "ttft:10000", "--require", "completed==8")
    assert run.exit_code == 0, run.output + run.stderr
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [lv["label"] for lv in doc["levels"]] == ["c1", "c4"]
    c4 = doc["levels"][1]
    assert c4["rounds"] == 2  # fast, slow, fast, slow
    for name in ("fast", "slow"):
        result = c4["results"][name]
        assert (result["completed"], result["failed"]) == (8, 0)
        assert result["total_output_tokens"] == 48
        assert result["request_goodput"] == pytest.approx(result["request_throughput"])
        for key in (
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "mean_ttft_ms",
            "median_tpot_ms",
            "p90_itl_ms",
            "p99_e2el_ms",
        ):
            assert result[key] > 0
    assert c4["results"]["fast"]["server"]["source"] == "health"
    assert c4["results"]["fast"]["server"]["max_running"] > 1  # the fake ran requests at once
    assert doc["levels"][0]["results"]["fast"]["server"]["max_running"] == 1
    assert c4["ratios"]["slow"]["output_throughput_ratio"] > 0
    assert doc["requirements"][0]["passed"] is True
    for name in (
        "summary.md",
        "throughput.png",
        "latency.png",
        "server.png",
        "runs/c4-fast.json",
        "runs/c1-slow.json",
    ):
        assert (tmp_path / name).stat().st_size > 0
    per_run = json.loads((tmp_path / "runs/c4-fast.json").read_text())
    assert per_run["max_concurrency"] == 4 and len(per_run["ttfts"]) == 8
    assert "fast vs slow" in run.output and "c4" in run.output


def test_missed_requirement_exits_3_after_writing_the_report(server: str, tmp_path: Path) -> None:
    run = small_run(
        server, tmp_path, "--concurrency", "2", "--require", "output_throughput_ratio>=1000"
    )
    assert run.exit_code == 3
    assert "MISS output_throughput_ratio>=1000" in run.output
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["requirements"][0]["passed"] is False


def test_failing_requests_are_reported_not_crashed_on(server: str, tmp_path: Path) -> None:
    run = bench(
        "--target",
        f"flaky={server}/flaky/v1",
        "--concurrency",
        "2",
        "--requests",
        "6",
        "--input-len",
        "6",
        "--output-len",
        "3",
        "--output",
        str(tmp_path),
    )
    assert run.exit_code == 0, run.output + run.stderr
    result = json.loads((tmp_path / "result.json").read_text())["levels"][0]["results"]["flaky"]
    assert (result["completed"], result["failed"]) == (3, 3)
    assert result["failures"] == {"stream_error": 3}
    assert "failures by status" in run.output


def test_poisson_and_burst_arrivals_send_every_request(server: str, tmp_path: Path) -> None:
    for arrivals, labels in (("poisson", ["r50", "r100"]), ("burst", ["burst"])):
        run = bench(
            "--target",
            f"fast={server}/v1",
            "--arrivals",
            arrivals,
            "--rate",
            "50,100",
            "--requests",
            "6",
            "--output-len",
            "2",
            "--prompts",
            "seed",
            "--output",
            str(tmp_path / arrivals),
        )
        assert run.exit_code == 0, run.output + run.stderr
        doc = json.loads((tmp_path / arrivals / "result.json").read_text())
        assert (doc["scenario"], doc["arrivals"]) == ("sweep", arrivals)
        assert [lv["label"] for lv in doc["levels"]] == labels
        assert all(lv["results"]["fast"]["completed"] == 6 for lv in doc["levels"])


def test_chat_endpoint(server: str, tmp_path: Path) -> None:
    run = bench(
        "--target",
        f"fast={server}/v1",
        "--endpoint",
        "chat",
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--input-len",
        "6",
        "--output-len",
        "3",
        "--output",
        str(tmp_path),
    )
    assert run.exit_code == 0, run.output + run.stderr
    result = json.loads((tmp_path / "result.json").read_text())["levels"][0]["results"]["fast"]
    assert result["completed"] == 2 and result["total_output_tokens"] == 6


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--slo", "ttft=5"], 2, "bad --slo"),
        (["--require", "throughput>>3"], 2, "bad --require"),
        (["--require", "output_throughput_ratio>=3"], 2, "a ratio needs two targets"),
        (["--concurrency", "0"], 2, "--concurrency"),
        (["--prompts", "EMPTY"], 2, "has no prompts"),
        (["--model", "other"], 1, "does not serve model 'other'"),
    ],
)
def test_bad_input_is_one_error_line(
    server: str, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    run = bench("--target", f"fast={server}/v1", "--output", str(tmp_path / "out"), *args)
    assert run.exit_code == code
    assert (
        run.stderr.count("\n") == 1 and run.stderr.startswith("error: ") and message in run.stderr
    )
    assert not (tmp_path / "out").exists()


def test_unreachable_and_non_openai_targets(server: str) -> None:
    port = free_port()  # nothing listens there
    run = bench("--target", f"gone=http://127.0.0.1:{port}/v1")
    assert run.exit_code == 1 and "cannot reach" in run.stderr and run.stderr.count("\n") == 1
    run = bench("--target", f"web={server}/nothing/here")
    assert run.exit_code == 1 and "not an OpenAI-compatible server" in run.stderr


def test_bad_target_syntax() -> None:
    run = bench("--target", "no-equals-sign")
    assert run.exit_code == 2 and "NAME=http" in run.stderr


def test_peer_engine_arguments_become_vllm_flags() -> None:
    flags = peers.engine_cli_args(
        {
            "dtype": "float32",
            "enforce_eager": True,
            "seed": None,
            "trust_remote_code": False,
            "served_model_name": ["a", "b"],
            "max_num_seqs": 8,
        }
    )
    assert flags == [
        "--dtype",
        "float32",
        "--enforce-eager",
        "--served-model-name",
        "a",
        "b",
        "--max-num-seqs",
        "8",
    ]


def test_ray_serve_llm_peer_gets_the_platform_engine_arguments(tmp_path: Path) -> None:
    config = parse_config(
        {
            "model": {"dtype": "float32", "max_model_len": 512},
            "vllm": {"max_ongoing_requests": 48, "engine": {"max_num_seqs": 8}},
        }
    )
    fields = peers.ray_llm_config(config, tmp_path, "default")
    assert fields["model_loading_config"] == {"model_id": "default", "model_source": str(tmp_path)}
    kwargs = fields["engine_kwargs"]
    assert (kwargs["dtype"], kwargs["max_model_len"], kwargs["max_num_seqs"]) == ("float32", 512, 8)
    assert not {"model", "served_model_name", "distributed_executor_backend"} & set(kwargs)
    assert fields["placement_group_config"] == {"bundles": [{"CPU": 1}]}
    assert fields["deployment_config"] == {"max_ongoing_requests": 48}
    # its engine computes on every core, as ours does, not on Ray's one-thread default
    assert fields["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def test_platform_origin_drops_the_route() -> None:
    assert peers.platform_origin("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert peers.platform_origin("http://127.0.0.1:9/x/v1") == "http://127.0.0.1:9"


def test_ray_serve_llm_peer_needs_a_running_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.local.platform

    monkeypatch.setattr(serving.local.platform, "load_state", lambda: None)
    with (
        pytest.raises(peers.PeerError, match="llm-serving up"),
        peers.ray_llm_peer(parse_config({}), "default"),
    ):
        pass


def completion_chunks(texts: list[str], completion_tokens: int) -> list[object]:
    from openai.types import Completion, CompletionChoice, CompletionUsage

    chunks: list[object] = [
        Completion(
            id="c",
            object="text_completion",
            created=0,
            model="m",
            choices=[CompletionChoice(index=0, text=t, finish_reason="length")],
        )
        for t in texts
    ]
    chunks.append(
        Completion(
            id="c",
            object="text_completion",
            created=0,
            model="m",
            choices=[],
            usage=CompletionUsage(
                prompt_tokens=3,
                completion_tokens=completion_tokens,
                total_tokens=3 + completion_tokens,
            ),
        )
    )
    return chunks


async def replay(chunks: list[object]) -> AsyncIterator[object]:
    for chunk in chunks:
        yield chunk


@pytest.mark.parametrize(
    ("texts", "tokens", "success", "status"),
    [
        (["a", "b"], 2, True, "ok"),
        (["", ""], 2, True, "ok"),  # special tokens only: work done, no text
        ([], 0, False, "empty"),
    ],
)
async def test_a_stream_succeeds_when_it_carried_text_or_counted_tokens(
    texts: list[str], tokens: int, success: bool, status: str
) -> None:
    from serving.loadgen.client import RequestResult, _consume

    result = RequestResult(start_time=time.perf_counter())
    await _consume(replay(completion_chunks(texts, tokens)), result)
    assert (result.success, result.status, result.output_tokens) == (success, status, tokens)
    assert result.ttft <= result.latency

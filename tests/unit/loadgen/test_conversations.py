"""Multi-turn and shared-prefix workloads: conversations resend their history, turns go out in
order (each after the last answer), a conversation keeps one model and one session, and the
report's prefix-cache hit rate comes from the usage the server returns."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from serving.api.routes import build_openai_app
from serving.cli import main
from serving.loadgen import client as client_module
from serving.loadgen import metrics, workloads
from serving.loadgen.args import UsageError, parse_targets
from serving.loadgen.client import RequestOptions, RequestResult, run_level
from tests.unit.fake_engine import FakeEngine
from tests.unit.loopback import serve_on_loopback


def test_every_turn_resends_the_history_and_asks_something_new() -> None:
    specs = workloads.multi_turn_requests(7, 3, 5, 4, seed=1)
    assert len(specs) == 7 and [s.conversation for s in specs] == [0, 0, 0, 1, 1, 1, 2]
    first, second, third = specs[:3]
    assert first.messages is not None and second.messages is not None and third.messages is not None
    assert [m["role"] for m in third.messages] == ["user", "assistant"] * 2 + ["user"]
    assert third.messages[: len(second.messages)] == second.messages  # the history, resent
    assert second.messages[: len(first.messages)] == first.messages
    assert third.messages[-1] != second.messages[-1]
    assert {s.session for s in specs[:3]} == {"conversation-0"}
    assert specs[3].session == "conversation-1"
    assert third.prompt.startswith(first.prompt)  # /completions sees the same growing prefix
    assert workloads.multi_turn_requests(7, 3, 5, 4, seed=1) == specs  # same seed, same requests


def test_shared_prefix_requests_share_the_system_prompt_only() -> None:
    specs = workloads.shared_prefix_requests(4, 20, 5, 3, seed=0)
    systems = {s.messages[0]["content"] for s in specs if s.messages}
    questions = {s.messages[1]["content"] for s in specs if s.messages}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 20
    assert len(questions) == 4
    assert all(s.conversation is None and s.session is None for s in specs)


@pytest.mark.parametrize("bad", [dict(turns=0), dict(input_len=0)])
def test_bad_lengths_are_refused(bad: dict[str, int]) -> None:
    args = dict(num=4, turns=2, input_len=5, output_len=3, seed=0) | bad
    with pytest.raises(workloads.WorkloadError):
        workloads.multi_turn_requests(**args)


def test_a_conversation_keeps_its_first_turns_model() -> None:
    specs = workloads.multi_turn_requests(40, 4, 3, 2, seed=0)
    mixed = workloads.assign_models(specs, {"a": 1, "b": 1}, seed=3)
    by_conversation: dict[int, set[str | None]] = {}
    for spec in mixed:
        by_conversation.setdefault(spec.conversation or 0, set()).add(spec.model)
    assert all(len(models) == 1 for models in by_conversation.values())
    assert {m for models in by_conversation.values() for m in models} == {"a", "b"}


def test_turns_go_out_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversations run side by side; within one, a turn starts after the last one ended."""
    spans: dict[tuple[int | None, str], tuple[float, float]] = {}

    async def fake_send(client: Any, opts: Any, spec: Any) -> RequestResult:
        start = time.perf_counter()
        await asyncio.sleep(0.02)
        spans[(spec.conversation, spec.prompt)] = (start, time.perf_counter())
        return RequestResult(success=True, start_time=start, latency=0.02, output_tokens=1)

    monkeypatch.setattr(client_module, "send_request", fake_send)
    specs = workloads.multi_turn_requests(9, 3, 3, 2, seed=0)
    level = workloads.LoadLevel("c3", 9, concurrency=3)
    run = asyncio.run(run_level(Any, RequestOptions("m"), level, specs, 60.0))
    assert all(r.success for r in run.results)
    for conversation in range(3):
        turns = [spans[(conversation, s.prompt)] for s in specs if s.conversation == conversation]
        assert all(later[0] >= earlier[1] for earlier, later in zip(turns, turns[1:]))
    starts = sorted(start for start, _ in spans.values())
    assert starts[2] - starts[0] < 0.015  # three conversations began together


def test_hit_rate_counts_cached_prompt_tokens_of_reporting_requests() -> None:
    done = [
        RequestResult(success=True, prompt_len=100, cached_tokens=80, replica="r1", ttft=0.1),
        RequestResult(success=True, prompt_len=100, cached_tokens=0, replica="r2", ttft=0.3),
        RequestResult(success=True, prompt_len=50, cached_tokens=None, replica="r2", ttft=0.2),
    ]
    assert metrics.prefix_cache_hit_rate(done) == pytest.approx(0.4)
    assert metrics.prefix_cache_hit_rate(done[2:]) is None
    summary = metrics.summarize(done, 1.0)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert summary["per_replica"]["r1"]["prefix_cache_hit_rate"] == pytest.approx(0.8)
    assert summary["per_replica"]["r2"]["completed"] == 2


def test_a_target_may_name_its_model() -> None:
    pow2, affinity = parse_targets(
        ("pow2=http://127.0.0.1:8000/v1#a", "affinity=http://127.0.0.1:8000/v1/")
    )
    assert (pow2.base_url, pow2.model) == ("http://127.0.0.1:8000/v1", "a")
    assert (affinity.base_url, affinity.model) == ("http://127.0.0.1:8000/v1", None)
    with pytest.raises(UsageError):
        parse_targets(("x=ftp://h#a",))


@pytest.mark.parametrize("workload", ["multi-turn", "shared-prefix"])
def test_bench_runs_chat_workloads_end_to_end(workload: str, tmp_path: Path) -> None:
    with serve_on_loopback(build_openai_app(FakeEngine(delay_s=0.001))) as url:
        run = CliRunner().invoke(
            main,
            [
                "bench",
                "sweep",
                "--target",
                f"fake={url}/v1",
                "--endpoint",
                "chat",
                "--prompts",
                workload,
                "--turns",
                "3",
                "--prefix-len",
                "8",
                "--concurrency",
                "2",
                "--requests",
                "6",
                "--input-len",
                "4",
                "--output-len",
                "2",
                "--output",
                str(tmp_path),
            ],
        )
    assert run.exit_code == 0, run.output
    result = json.loads((tmp_path / "result.json").read_text())["levels"][0]["results"]["fake"]
    assert result["completed"] == 6
    assert "cache hit" in run.output


def test_each_conversation_may_open_with_its_own_context() -> None:
    specs = workloads.multi_turn_requests(4, 2, 3, 2, seed=0, context_len=12)
    contexts = [s.messages[0]["content"] for s in specs if s.messages]
    assert all(s.messages and s.messages[0]["role"] == "system" for s in specs)
    assert contexts[0] == contexts[1] != contexts[2] == contexts[3]  # one per conversation
    assert len(contexts[0].split()) == 12

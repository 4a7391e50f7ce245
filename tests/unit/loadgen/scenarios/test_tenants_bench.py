"""`bench tenants`: the maths (Jain's index, max-min fair shares, per-tenant figures) on
hand-built requests, the gates, the inputs refused before anything is sent, and the phases run
end to end with the client's send replaced (no server)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from serving.cli import main
from serving.loadgen import client, require
from serving.loadgen.args import UsageError
from serving.loadgen.client import RequestResult
from serving.loadgen.scenarios import tenants, tenants_report
from serving.loadgen.scenarios.tenants_report import (
    PhaseRun,
    jain_index,
    max_min_shares,
    target_summary,
    tenant_summary,
)


def args(**given: Any) -> tenants.TenantsArgs:
    values: dict[str, Any] = dict(
        target_items=("tenants=http://127.0.0.1:9/v1",), tenant_items=("quiet=k1", "noisy=k2"),
        noisy=None, concurrency=2, input_len=16, output_len=4, duration=0.3, max_requests=50,
        model=None, endpoint="completions", request_timeout=5.0, peer=None, config_path=None,
        baseline=None, merge_dirs=(), requirements=(), seed=0,
    )  # fmt: skip
    return tenants.TenantsArgs(**(values | given))


def served(tokens: int, seconds: float, ttfts: list[float], failed: int = 0) -> list[RequestResult]:
    """Requests that started at 0 and served `tokens` (10 output each) by `seconds`."""
    ok = [
        RequestResult(
            success=True,
            prompt_len=tokens // len(ttfts) - 10,
            output_tokens=10,
            ttft=ttft,
            latency=seconds,
        )
        for ttft in ttfts
    ]
    return ok + [RequestResult(status="http_429", latency=0.1) for _ in range(failed)]


# -- the maths ---------------------------------------------------------------------------------


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all() -> None:
    assert jain_index([5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert jain_index([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert jain_index([]) is None and jain_index([0.0, 0.0]) is None


def test_max_min_shares_give_a_capped_tenants_leftover_to_the_others() -> None:
    assert max_min_shares(10, [100, 100]) == [5, 5]
    assert max_min_shares(10, [2, 100]) == [2, 8]
    assert max_min_shares(9, [1, 2, 10]) == [1, 2, 6]
    assert max_min_shares(10, [1, 2]) == [1, 2]  # more than asked: each gets its demand


def test_a_tenants_figures_count_prompt_and_output_over_its_own_time() -> None:
    results = served(400, 4.0, [0.1, 0.2, 0.3, 0.4], failed=1)
    results.append(RequestResult(status=client.NOT_STARTED))
    summary = tenant_summary(results, start=0.0)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (5, 4, 1)
    assert (summary["prompt_tokens"], summary["output_tokens"]) == (360, 40)
    assert summary["served_tokens"] == 400 and summary["token_throughput"] == 100.0
    assert summary["output_throughput"] == 10.0
    assert summary["ttft_p50_ms"] == 250.0 and summary["ttft_p99_ms"] == 397.0


def test_a_tenant_with_no_answer_has_no_ttft_rather_than_zero() -> None:
    summary = tenant_summary([RequestResult(status="http_401", latency=0.1)], start=0.0)
    assert summary["ttft_p50_ms"] is None and summary["served_tokens"] == 0


PAIRS = [("quiet", False), ("noisy", True)]


def summary_of(quiet_mixed: int, noisy_mixed: int, quiet_ttft: float = 0.1) -> dict[str, Any]:
    """Alone: quiet 100 tok/s, noisy 800 tok/s; together over 10 s: the given tokens."""
    solo = {
        "quiet": PhaseRun({"quiet": served(1000, 10.0, [0.1] * 10)}, 0.0),
        "noisy": PhaseRun({"noisy": served(8000, 10.0, [0.5] * 8)}, 0.0),
    }
    mixed = PhaseRun(
        {
            "quiet": served(quiet_mixed, 10.0, [quiet_ttft] * 10),
            "noisy": served(noisy_mixed, 10.0, [0.5] * 8),
        },
        0.0,
    )
    return target_summary("t", "http://127.0.0.1:1/v1", PAIRS, solo, mixed)


def test_jain_tells_a_fair_share_from_a_starved_quiet_tenant() -> None:
    fair = summary_of(quiet_mixed=900, noisy_mixed=6000)
    # 690 tok/s in all; the quiet tenant can use 100 of its 345, so it is owed 100, noisy 590.
    assert fair["tenants"]["quiet"]["fair_share_tokens_per_s"] == 100.0
    assert fair["tenants"]["noisy"]["fair_share_tokens_per_s"] == 590.0
    assert fair["tenants"]["quiet"]["fair_ratio"] == 0.9
    assert fair["jain"] > 0.99
    starved = summary_of(quiet_mixed=200, noisy_mixed=6720)
    assert starved["jain"] < 0.7
    # Unnormalised, both runs look unfair: the quiet tenant never could use half the engine.
    assert fair["jain_raw"] < 0.7 and starved["jain_raw"] < fair["jain_raw"]
    assert (fair["mixed_token_throughput"], starved["mixed_token_throughput"]) == (690.0, 692.0)


def test_ttft_ratios_are_mixed_over_alone_and_the_worst_quiet_one_is_gated() -> None:
    summary = summary_of(900, 6000, quiet_ttft=0.25)
    quiet = summary["tenants"]["quiet"]
    assert (quiet["solo"]["ttft_p50_ms"], quiet["mixed"]["ttft_p50_ms"]) == (100.0, 250.0)
    assert quiet["ttft_p50_ratio"] == 2.5 and quiet["ttft_p99_ratio"] == 2.5
    assert summary["quiet_ttft_p99_ratio"] == 2.5  # the noisy tenant's own ratio is not in it
    assert summary["single_tenant"]["tenant"] == "quiet"
    assert summary["single_tenant"]["token_throughput"] == 100.0


def test_the_single_tenant_overhead_is_against_the_baseline() -> None:
    platform, plain = summary_of(900, 6000), summary_of(900, 6000)
    plain["name"] = "vllm-serve"
    plain["single_tenant"] = {**plain["single_tenant"], "token_throughput": 125.0}
    both = tenants_report.with_baseline([platform, plain], "vllm-serve")
    assert both[0]["solo_throughput_ratio"] == 0.8 and both[1]["solo_throughput_ratio"] == 1.0
    assert both[0]["solo_ttft_p50_ratio"] == 1.0


# -- gates -------------------------------------------------------------------------------------


def reqs(*texts: str) -> list[require.Requirement]:
    return [require.parse_requirement(text) for text in texts]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t.jainn>=0.9", "unknown metric"),
        ("t.ttft_p99_ratio<=1.5", "name a tenant"),
        ("t.ttft_p99_ratio@loud<=1.5", "name a tenant"),
        ("t.jain@quiet>=0.9", "a target's figure"),
        ("other.jain>=0.9", "no target named"),
    ],
)
def test_gates_naming_nothing_measured_fail_before_the_run(text: str, message: str) -> None:
    with pytest.raises(require.RequireError, match=message):
        tenants_report.validate_gates(reqs(text), ["t"], ["quiet", "noisy"])


def test_gates_read_a_targets_and_a_tenants_figures() -> None:
    doc = {"subject": "t", "targets": tenants_report.with_baseline([summary_of(900, 6000)], "t")}
    gates = reqs(
        "jain>=0.99",
        "t.jain>=0.999",
        "ttft_p99_ratio@quiet<=1.5",
        "mixed_ttft_p50_ms@noisy<=500",
        "solo_token_throughput@quiet>=100",
    )
    tenants_report.validate_gates(gates, ["t"], ["quiet", "noisy"])
    checks = tenants_report.evaluate(gates, doc)
    assert [c.passed for c in checks] == [True, False, True, True, True]
    assert checks[2].where == "t @ quiet" and checks[3].actual == 500.0


# -- inputs ------------------------------------------------------------------------------------


def test_the_noisy_tenant_is_the_last_by_default_with_8x_prompts_and_4x_concurrency() -> None:
    quiet, noisy = tenants.parse_tenants(("quiet=k1", "noisy=k2"), None, 3, 100)
    assert (quiet.noisy, quiet.concurrency, quiet.input_len) == (False, 3, 100)
    assert (noisy.noisy, noisy.concurrency, noisy.input_len) == (True, 12, 800)
    first, _ = tenants.parse_tenants(("a=k1", "b=k2"), "a", 1, 10)
    assert first.noisy and first.concurrency == 4


def test_a_key_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIET_KEY", "secret")
    quiet, _ = tenants.parse_tenants(("quiet=env:QUIET_KEY", "noisy=k2"), None, 1, 1)
    assert quiet.key == "secret"
    with pytest.raises(UsageError, match="UNSET_KEY"):
        tenants.parse_tenants(("quiet=env:UNSET_KEY", "noisy=k2"), None, 1, 1)


@pytest.mark.parametrize(
    ("items", "noisy", "message"),
    [
        (("quiet=k1",), None, "two or more"),
        (("quiet=k1", "quiet=k2"), None, "must differ"),
        (("quiet=k1", "noisy=k1"), None, "key of its own"),
        (("quiet=k1", "noisy=k2"), "loud", "not a --tenant"),
        (("quiet", "noisy=k2"), None, "expected NAME=KEY"),
        (("bad name=k1", "noisy=k2"), None, "expected NAME=KEY"),
    ],
)
def test_bad_tenants_are_usage_errors(items: tuple[str, ...], noisy: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        tenants.parse_tenants(items, noisy, 1, 1)


def test_the_report_never_holds_a_key() -> None:
    plan = tenants.build_plan(args(tenant_items=("quiet=sk-quiet-1", "noisy=sk-noisy-2")))
    assert "sk-" not in json.dumps(tenants.workload(args(), plan.tenants, "m"))


def bench(*argv: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(main, ["bench", "tenants", *argv])
    return (
        result.exit_code,
        [ln for ln in result.output.splitlines() if ln.startswith("error:")],
        result.output,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tenant", "quiet", "--tenant", "noisy=k2"], "--tenant 'quiet'"),
        (["--tenant", "quiet=k1"], "two or more"),
        (["--tenant", "quiet=k1", "--tenant", "noisy=k2", "--noisy", "x"], "--noisy"),
        (["--tenant", "q=k1", "--tenant", "n=k2", "--baseline", "nope"], "--baseline"),
        (["--tenant", "q=k1", "--tenant", "n=k2", "--require", "jain>"], "bad --require"),
        (["--tenant", "q=k1", "--tenant", "n=k2", "--merge", "/nonexistent"], "--merge"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(argv: list[str], message: str) -> None:
    code, errors, output = bench("--target", "t=http://127.0.0.1:9/v1", *argv)
    assert code == 2 and len(errors) == 1 and message in errors[0], output


def test_a_target_off_this_machine_is_refused_before_anything_is_sent() -> None:
    code, errors, output = bench(
        "--target", "far=http://10.1.2.3:8000/v1", "--tenant", "q=k1", "--tenant", "n=k2"
    )
    assert code == 2 and len(errors) == 1 and "loopback targets only" in errors[0], output


# -- the phases, the client's send replaced ----------------------------------------------------


class FakeSend:
    """Answers after `delay_s`, 10 output tokens, the prompt's words as its tokens; records the
    key each request carried and how many of each key were in flight at once."""

    def __init__(self, delay_s: float = 0.005) -> None:
        self.delay_s = delay_s
        self.keys: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.most: dict[str, int] = {}

    async def __call__(self, http: Any, opts: Any, spec: Any) -> RequestResult:
        key = http.api_key
        self.keys.append(key)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.in_flight[key])
        start = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        self.in_flight[key] -= 1
        return RequestResult(
            success=True,
            prompt_len=len(spec.prompt.split()),
            output_tokens=spec.output_len,
            ttft=self.delay_s / 2,
            latency=time.perf_counter() - start,
            start_time=start,
        )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSend:
    send = FakeSend()
    monkeypatch.setattr(client, "send_request", send)

    async def models(target: Any, tenant: Any, timeout_s: float = 10.0) -> list[str]:
        return ["m"]

    monkeypatch.setattr(tenants, "served_with_key", models)
    return send


def test_each_tenant_runs_alone_then_all_together_with_its_own_key(fake: FakeSend) -> None:
    plan = tenants.build_plan(args())
    opts = client.RequestOptions("m")
    phases: list[str] = []
    solo, mixed = asyncio.run(
        tenants.run_target(args(), plan.targets[0], plan.tenants, opts, 0, phases.append)
    )
    assert [line.split(": ")[1].split(" (")[0] for line in phases] == [
        f"warm-up, {tenants.WARMUP_REQUESTS} requests a tenant",
        "quiet alone",
        "noisy alone",
        "all 2 tenants together",
    ]
    assert set(solo["quiet"].results) == {"quiet"} and set(mixed.results) == {"quiet", "noisy"}
    assert fake.most == {"k1": 2, "k2": 8}  # the noisy tenant keeps 4x the quiet one's
    quiet, noisy = mixed.results["quiet"][0], mixed.results["noisy"][0]
    assert (quiet.prompt_len, noisy.prompt_len) == (16, 128)  # 8x the prompt
    assert all(len(p.results[t]) <= 50 for t, p in solo.items())  # --max-requests


def test_a_phase_stops_at_max_requests_before_its_duration(fake: FakeSend) -> None:
    plan = tenants.build_plan(args(max_requests=3, duration=30.0))
    began = time.perf_counter()
    run = asyncio.run(
        tenants.run_phase(
            plan.targets[0],
            client.RequestOptions("m"),
            plan.tenants,
            tenants.phase_specs(args(max_requests=3), plan.tenants, 0),
            30.0,
        )
    )
    assert time.perf_counter() - began < 5
    assert [len(r) for r in run.results.values()] == [3, 3]


def test_no_request_starts_after_the_phases_duration(fake: FakeSend) -> None:
    plan = tenants.build_plan(args(max_requests=5000))
    specs = tenants.phase_specs(args(max_requests=5000), plan.tenants, 0)
    began = time.perf_counter()
    run = asyncio.run(
        tenants.run_phase(plan.targets[0], client.RequestOptions("m"), plan.tenants, specs, 0.1)
    )
    assert time.perf_counter() - began < 2
    assert all(0 < len(results) < 500 for results in run.results.values())
    last_start = max(r.start_time for results in run.results.values() for r in results)
    assert last_start < run.start + 0.1


def test_a_missed_gate_writes_the_report_and_exits_3(fake: FakeSend, tmp_path: Path) -> None:
    out = tmp_path / "report"
    code, errors, output = bench(
        "--target", "tenants=http://127.0.0.1:9/v1", "--tenant", "quiet=sk-q", "--tenant",
        "noisy=sk-n", "--duration", "0.2", "--max-requests", "20", "--output", str(out),
        "--require", "tenants.jain>=2", "--require", "failed<=0",
    )  # fmt: skip
    assert code == 3 and not errors, output
    doc = json.loads((out / "result.json").read_text())
    assert doc["scenario"] == "tenants" and doc["baseline"] == "tenants"
    assert [r["passed"] for r in doc["requirements"]] == [False, True]
    target = doc["targets"][0]
    assert target["solo_throughput_ratio"] == 1.0 and 0 < target["jain"] <= 1
    assert target["tenants"]["noisy"]["mixed"]["served_tokens"] > 0
    assert (out / "runs" / "tenants" / "mixed-noisy.json").is_file()
    assert "Jain" in (out / "summary.md").read_text()
    assert "sk-" not in (out / "result.json").read_text() + (out / "summary.md").read_text()


def test_an_earlier_run_merges_only_when_its_workload_is_the_same(
    fake: FakeSend, tmp_path: Path
) -> None:
    first = tmp_path / "first-come"
    base = ["--tenant", "quiet=k1", "--tenant", "noisy=k2", "--duration", "0.2"]
    code, _, output = bench("--target", "fcfs=http://127.0.0.1:9/v1", *base, "--output", str(first))
    assert code == 0, output
    code, _, output = bench(
        "--target", "tenants=http://127.0.0.1:9/v1", *base, "--merge", str(first),
        "--baseline", "fcfs", "--output", str(tmp_path / "both"),
    )  # fmt: skip
    assert code == 0, output
    doc = json.loads((tmp_path / "both" / "result.json").read_text())
    assert [t["name"] for t in doc["targets"]] == ["tenants", "fcfs"]
    assert (
        doc["targets"][1]["from"] == str(first)
        and doc["targets"][1]["solo_throughput_ratio"] == 1.0
    )
    code, errors, output = bench(
        "--target", "tenants=http://127.0.0.1:9/v1", *base, "--concurrency", "3",
        "--merge", str(first),
    )  # fmt: skip
    assert code == 2 and "differs" in errors[0], output
    code, errors, output = bench(
        "--target", "fcfs=http://127.0.0.1:9/v1", *base, "--merge", str(first)
    )
    assert code == 2 and "in this run too" in errors[0], output

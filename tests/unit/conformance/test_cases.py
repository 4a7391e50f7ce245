"""The conformance matrix without a model: classification of what a case ended with, the table
and the superset check over fake results, and the command against a fake server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from serving.cli import main
from serving.conformance.context import Target
from serving.conformance.outcome import (
    FAILS,
    NOT_OFFERED,
    OK,
    REASON_CHARS,
    CaseFailed,
    Outcome,
    classify_exception,
    classify_status,
)
from serving.conformance.report import matrix, superset_regressions, to_json, to_markdown
from serving.conformance.route_cases import case_models, case_tokenize_round_trip
from serving.conformance.runner import (
    CaseResult,
    ConformanceError,
    parse_target,
    parse_targets,
    run_target,
)
from serving.conformance.sampling_cases import case_max_tokens, case_top_k
from tests.unit.loopback import free_port, serve_on_loopback


def status_error(status: int, body: dict) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, json=body, request=request)
    client = openai.OpenAI(base_url="http://127.0.0.1/v1", api_key="x")
    return client._make_status_error_from_response(response)


def result(case: str, target: str, status: str, reason: str = "") -> CaseResult:
    return CaseResult(case, target, Outcome(status, reason), 0.1)


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (404, "Not Found", NOT_OFFERED),
        (405, "Method Not Allowed", NOT_OFFERED),
        (400, "unrecognized request argument: top_k", NOT_OFFERED),
        (400, "logit_bias is not supported", NOT_OFFERED),
        (422, "top_k: Extra inputs are not permitted", NOT_OFFERED),
        (400, "max_tokens must be at least 1, got 0", FAILS),
        (500, "internal error: top_k is not supported", FAILS),
        (503, "queue full", FAILS),
    ],
)
def test_classify_status(status: int, message: str, expected: str) -> None:
    outcome = classify_status(status, message)
    assert outcome.status == expected
    assert outcome.reason.startswith(str(status))


def test_classify_openai_error_reads_the_openai_error_message() -> None:
    err = status_error(
        400,
        {
            "error": {
                "message": "unrecognized request argument: min_p",
                "type": "invalid_request_error",
            }
        },
    )
    assert classify_exception(err) == Outcome(
        NOT_OFFERED, "400: unrecognized request argument: min_p"
    )
    assert classify_exception(status_error(404, {"detail": "Not Found"})).status == NOT_OFFERED
    assert classify_exception(
        status_error(500, {"error": {"message": "boom", "type": "x"}})
    ) == Outcome(FAILS, "500: boom")


def test_classify_other_failures() -> None:
    assert classify_exception(CaseFailed("no usage chunk")) == Outcome(FAILS, "no usage chunk")
    request = httpx.Request("GET", "http://127.0.0.1/")
    assert classify_exception(openai.APITimeoutError(request)) == Outcome(FAILS, "timeout")
    assert classify_exception(httpx.ReadTimeout("slow", request=request)) == Outcome(
        FAILS, "timeout"
    )
    assert classify_exception(KeyError("x")).reason == "KeyError: 'x'"
    long = classify_exception(CaseFailed("word " * 100)).reason
    assert len(long) == REASON_CHARS and long.endswith("...") and "\n" not in long


def test_cells() -> None:
    assert Outcome(OK).cell == "ok"
    assert Outcome(NOT_OFFERED, "404: Not Found").cell == "not offered"
    assert Outcome(FAILS, "timeout").cell == "fails: timeout"


RESULTS = [
    result("top_k", "vllm", OK),
    result("top_k", "platform", NOT_OFFERED, "400: unrecognized"),
    result("echo", "vllm", FAILS, "a | b"),
    result("echo", "platform", OK),
    result("n=2", "vllm", OK),
    result("n=2", "platform", OK),
    result("tokenize", "vllm", OK),  # the platform run stopped before this case
]


def test_matrix_has_a_row_per_case_and_a_cell_per_target() -> None:
    assert matrix(RESULTS, ["vllm", "platform"]) == [
        ["top_k", "ok", "not offered"],
        ["echo", "fails: a | b", "ok"],
        ["n=2", "ok", "ok"],
        ["tokenize", "ok", "-"],
    ]


def test_markdown_table_escapes_pipes() -> None:
    lines = to_markdown(RESULTS, ["vllm", "platform"]).splitlines()
    assert lines[0] == "| feature | vllm | platform |"
    assert lines[1] == "| --- | --- | --- |"
    assert lines[3] == "| echo | fails: a \\| b | ok |"
    assert len(lines) == 2 + 4


def test_json_report_keeps_reasons_and_models() -> None:
    targets = [Target("vllm", "http://a/v1"), Target("platform", "http://b/v1")]
    report = json.loads(json.dumps(to_json(RESULTS, targets, {"vllm": "m", "platform": "m"})))
    assert report["cases"] == ["top_k", "echo", "n=2", "tokenize"]
    assert report["targets"][1] == {"name": "platform", "url": "http://b/v1", "model": "m"}
    assert {
        "case": "top_k",
        "target": "platform",
        "status": "not offered",
        "reason": "400: unrecognized",
        "seconds": 0.1,
    } in report["results"]


def test_superset_regressions_are_cases_ok_on_base_and_not_elsewhere() -> None:
    found = superset_regressions(RESULTS, "vllm")
    assert [(r.case, r.target, r.cell) for r in found] == [
        ("top_k", "platform", "not offered"),
        ("tokenize", "platform", "-"),
    ]
    assert superset_regressions(RESULTS, "platform") == [
        type(found[0])("echo", "vllm", "fails: a | b"),
    ]


def test_parse_target() -> None:
    assert parse_target("vllm=http://127.0.0.1:8000/v1/") == Target(
        "vllm", "http://127.0.0.1:8000/v1"
    )
    assert Target("p", "http://h:1/v1").root == "http://h:1"
    for bad in (
        "http://127.0.0.1:8000/v1",
        "x=http://127.0.0.1:8000",
        "x=ftp://h/v1",
        "=http://h/v1",
    ):
        with pytest.raises(ConformanceError):
            parse_target(bad)
    with pytest.raises(ConformanceError, match="once"):
        parse_targets(["a=http://h/v1", "a=http://g/v1"])


def fake_server() -> FastAPI:
    """A server that refuses top_k as unknown, answers completions without usage-bound checks
    failing, and mounts neither /tokenize nor /detokenize."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "me"}],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        if "top_k" in body:
            return JSONResponse(
                {
                    "error": {
                        "message": "unrecognized request argument: top_k",
                        "type": "invalid_request_error",
                    }
                },
                status_code=400,
            )
        # Ignores max_tokens: always 5 tokens, so the max_tokens case must fail.
        return JSONResponse(
            {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": "fake",
                "choices": [
                    {"index": 0, "text": "a b c", "finish_reason": "length", "logprobs": None}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
            }
        )

    return app


def test_cases_against_a_fake_server_on_loopback() -> None:
    cases = {
        "models": case_models,
        "top_k": case_top_k,
        "max_tokens": case_max_tokens,
        "tokenize": case_tokenize_round_trip,
    }
    with serve_on_loopback(fake_server()) as url:
        results = run_target(Target("fake", f"{url}/v1"), "fake", "unused", 10.0, cases)
    outcomes = {r.case: r.outcome for r in results}
    assert outcomes["models"] == Outcome(OK)
    assert outcomes["top_k"].status == NOT_OFFERED
    assert outcomes["max_tokens"] == Outcome(FAILS, "5 tokens for a limit of 3")
    assert outcomes["tokenize"].status == NOT_OFFERED and outcomes["tokenize"].reason.startswith(
        "404"
    )


def test_command_errors_are_one_line() -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["conformance", "--target", "nourl"])
    assert bad.exit_code == 1 and bad.output.strip().startswith("error: --target 'nourl'")
    port = free_port()  # nothing listens there
    down = runner.invoke(
        main,
        [
            "conformance",
            "--target",
            f"gone=http://127.0.0.1:{port}/v1",
            "--model",
            "m",
            "--timeout",
            "5",
        ],
    )
    assert down.exit_code == 1
    assert down.output.strip().splitlines() == [
        f"error: target gone at http://127.0.0.1:{port}/v1: cannot list models: Connection error."
    ]
    base = runner.invoke(
        main, ["conformance", "--target", "a=http://h/v1", "--require-superset", "b"]
    )
    assert (
        base.exit_code == 1 and "error: --require-superset 'b' is not a target name" in base.output
    )


def test_peer_vllm_with_a_bad_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "platform.yaml"
    config.write_text("model:\n  reff: default\n")
    result = CliRunner().invoke(
        main, ["conformance", "--target", "a=http://127.0.0.1:9/v1", "--peer-vllm", str(config)]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "reff" in lines[0]

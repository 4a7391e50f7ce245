"""Reading a batch input file and writing its output lines (serving/state/batch_lines.py)."""

from __future__ import annotations

import json

import pytest

from serving.state.batch_lines import (
    LineError,
    ParsedFile,
    error_line,
    output_line,
    parse_input,
    parse_line,
)
from serving.state.batch_runner import line_body
from serving.state.batches import BatchAPIError, window_seconds

CHAT = "/v1/chat/completions"
MODELS = {"tiny", "tiny-lora"}


def request(custom_id: str, model: str | None = "tiny", url: str = CHAT, **extra: object) -> str:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if model is not None:
        body["model"] = model
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra})


def parse(*rows: str, max_lines: int = 100) -> ParsedFile:
    return parse_input("\n".join(rows).encode(), CHAT, MODELS, "tiny", max_lines)


def test_good_lines_run_with_their_model_and_line_number() -> None:
    parsed = parse(request("a"), "", request("b", model="tiny-lora"), request("c", model=None))
    assert [(n, model) for n, model, _ in parsed.runnable] == [
        (1, "tiny"),
        (3, "tiny-lora"),
        (4, "tiny"),  # no model: the default one
    ]
    assert json.loads(parsed.runnable[0][2])["custom_id"] == "a"
    assert parsed.invalid == [] and parsed.fatal == [] and parsed.total == 3


@pytest.mark.parametrize(
    ("row", "code"),
    [
        ("{not json", "invalid_json_line"),
        ("[1, 2]", "invalid_json_line"),
        (json.dumps({"method": "POST", "url": CHAT, "body": {}}), "missing_required_parameter"),
        (request("x", extra_field=1), "invalid_request"),
        (request("x", model="gpt-4"), "model_not_found"),
        (request("x", url="/v1/completions"), "invalid_url"),
        (request("x").replace('"POST"', '"GET"'), "invalid_method"),
    ],
)
def test_a_bad_line_is_an_error_line_not_a_failed_batch(row: str, code: str) -> None:
    parsed = parse(request("ok"), row)
    assert parsed.fatal == []
    assert [n for n, _, _ in parsed.runnable] == [1]
    [(n, _, error)] = parsed.invalid
    assert n == 2 and error.code == code


def test_a_repeated_custom_id_is_an_error_line() -> None:
    parsed = parse(request("a"), request("a"))
    assert [n for n, _, _ in parsed.runnable] == [1]
    assert [(n, cid, e.code) for n, cid, e in parsed.invalid] == [(2, "a", "duplicate_custom_id")]


def test_files_that_cannot_run_fail_the_batch() -> None:
    assert parse("").fatal[0]["code"] == "empty_file"
    assert parse(request("a"), request("b"), max_lines=1).fatal[0]["code"] == "too_many_requests"
    assert parse("not jsonl", "at all").fatal[0]["code"] == "invalid_file"
    other = parse(request("a", url="/v1/completions"))
    assert other.fatal[0]["code"] == "mismatched_endpoint"
    not_text = parse_input(b"\xff\xfe", CHAT, MODELS, "tiny", 10)
    assert not_text.fatal[0]["code"] == "invalid_file"


def test_output_lines_are_in_openais_format() -> None:
    body = {"id": "chatcmpl-1", "choices": []}
    line = output_line("a", 200, body, "chatcmpl-1")
    assert line["id"].startswith("batch_req_") and line["custom_id"] == "a"
    assert line["response"] == {"status_code": 200, "request_id": "chatcmpl-1", "body": body}
    assert line["error"] is None


def test_an_engine_error_keeps_its_response_and_names_the_error() -> None:
    body = {"error": {"message": "max_tokens too large", "type": "BadRequestError", "code": 400}}
    line = output_line("a", 400, body, "req_1")
    assert line["response"]["status_code"] == 400 and line["response"]["body"] == body
    assert line["error"] == {"code": 400, "message": "max_tokens too large"}
    bare = output_line("b", 503, "unavailable", "req_2")
    assert bare["error"]["code"] == "http_503"


def test_a_line_that_never_ran_has_no_response() -> None:
    line = error_line(None, LineError("invalid_json_line", "bad"))
    assert line["response"] is None and line["custom_id"] is None
    assert line["error"] == {"code": "invalid_json_line", "message": "bad"}


def test_parse_line_reads_one_request() -> None:
    line = parse_line(request("a"))
    assert not isinstance(line, LineError) and line.body["max_tokens"] == 1


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("1h", 3600), ("5m", 300)])
def test_completion_windows(window: str, seconds: int) -> None:
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window", ["25h", "0h", "1d", "", "24"])
def test_completion_windows_refused(window: str) -> None:
    with pytest.raises(BatchAPIError) as refused:
        window_seconds(window)
    assert refused.value.param == "completion_window" and refused.value.status == 400


def test_a_line_runs_below_online_requests_and_unstreamed() -> None:
    chat = {"url": CHAT, "body": {"model": "tiny", "stream": True, "priority": -5}}
    assert line_body(chat, 10) == {"model": "tiny", "stream": False, "priority": 10}
    embed = {"url": "/v1/embeddings", "body": {"model": "tiny", "input": "x"}}
    assert line_body(embed, 10) == {"model": "tiny", "input": "x", "priority": 10}

"""The lines of an OpenAI Batch API job, as pure functions: reading an input file (JSONL, one
request per line), and writing output and error lines in OpenAI's format. A line that cannot run
(not JSON, a wrong url or method, a missing or repeated custom_id, an unknown model) is an error
line of the batch, not a failed batch; a file that is not JSONL at all, holds too many lines or
mixes endpoints fails the whole batch (OpenAI's `errors.data`)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
NO_MODEL = ""  # the model column of a line that never runs (an error line from the start)


class InputLine(BaseModel):
    """One request of a batch input file (OpenAI's request input object)."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    """Why one line cannot run: OpenAI's per-line `error` object."""

    code: str
    message: str


@dataclass
class ParsedFile:
    """An input file read against a batch: lines to run (line, model, request JSON), error lines
    (line, custom_id, LineError), and errors that fail the whole batch (OpenAI's BatchError)."""

    runnable: list[tuple[int, str, str]] = field(default_factory=list)
    invalid: list[tuple[int, str | None, LineError]] = field(default_factory=list)
    fatal: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.runnable) + len(self.invalid)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def fatal_error(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def parse_line(text: str) -> InputLine | LineError:
    try:
        data = json.loads(text)
    except ValueError as err:
        return LineError("invalid_json_line", f"the line is not valid JSON: {err}")
    if not isinstance(data, dict):
        return LineError("invalid_json_line", "the line is not a JSON object")
    try:
        return InputLine.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "line"
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_request"
        return LineError(code, f"{where}: {first['msg']}")


def line_problem(
    line: InputLine, endpoint: str, models: Collection[str], default_model: str
) -> LineError | None:
    """Why a well-formed line cannot run in this batch, if it cannot."""
    if line.method.upper() != "POST":
        return LineError("invalid_method", f"method {line.method!r}: only POST is supported")
    if line.url != endpoint:
        return LineError(
            "invalid_url", f"url {line.url!r} differs from the batch's endpoint {endpoint}"
        )
    model = line.body.get("model", default_model)
    if not isinstance(model, str) or model not in models:
        return LineError(
            "model_not_found",
            f"the model `{model}` does not exist; available models: {', '.join(sorted(models))}",
        )
    return None


def parse_input(
    content: bytes, endpoint: str, models: Collection[str], default_model: str, max_lines: int
) -> ParsedFile:
    """Read an input file against a batch's endpoint and the models served (line numbers from 1,
    as OpenAI's `errors.data[].line`). Blank lines are skipped."""
    parsed = ParsedFile()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        parsed.fatal.append(fatal_error("invalid_file", "the input file is not UTF-8 text"))
        return parsed
    rows = [(n, row) for n, row in enumerate(text.splitlines(), start=1) if row.strip()]
    if not rows:
        parsed.fatal.append(fatal_error("empty_file", "the input file holds no requests"))
        return parsed
    if len(rows) > max_lines:
        message = f"the input file holds {len(rows)} requests; the limit is {max_lines}"
        parsed.fatal.append(fatal_error("too_many_requests", message))
        return parsed
    seen: set[str] = set()
    for n, row in rows:
        line = parse_line(row)
        if isinstance(line, LineError):
            parsed.invalid.append((n, None, line))
            continue
        problem = line_problem(line, endpoint, models, default_model)
        if problem is None and line.custom_id in seen:
            problem = LineError("duplicate_custom_id", f"custom_id {line.custom_id!r} repeats")
        seen.add(line.custom_id)
        if problem is not None:
            parsed.invalid.append((n, line.custom_id, problem))
            continue
        model = line.body.get("model", default_model)
        parsed.runnable.append((n, model, line.model_dump_json()))
    mixed = {error.code for _, _, error in parsed.invalid} == {"invalid_url"}
    if mixed and not parsed.runnable:
        message = f"no line's url is the batch's endpoint {endpoint}"
        parsed.fatal.append(fatal_error("mismatched_endpoint", message))
    elif not parsed.runnable and all(cid is None for _, cid, _ in parsed.invalid):
        parsed.fatal.append(fatal_error("invalid_file", "no line of the file is a JSON request"))
    return parsed


# -- output lines ---------------------------------------------------------------------------------


def output_line(custom_id: str, status: int, body: Any, request_id: str) -> dict[str, Any]:
    """A request's answer: in the output file when 2xx; otherwise in the error file with the
    engine's OpenAI error as `error` too."""
    line: dict[str, Any] = {
        "id": new_id("batch_req"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }
    if not 200 <= status < 300:
        inner = body.get("error") if isinstance(body, dict) else None
        inner = inner if isinstance(inner, dict) else {}
        line["error"] = {
            "code": inner.get("code") or inner.get("type") or f"http_{status}",
            "message": inner.get("message") or f"the request failed with status {status}",
        }
    return line


def error_line(custom_id: str | None, error: LineError) -> dict[str, Any]:
    """A line that never ran: no response, only its error."""
    return {
        "id": new_id("batch_req"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": error.code, "message": error.message},
    }


def custom_id_of(request: str) -> str:
    return str(json.loads(request)["custom_id"])


def dump(line: dict[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"))

"""The OpenAI Batch API on the real platform, through the official `openai` client: a file
uploaded, a batch of 500 lines run on the vLLM replica below online requests, every input line
answered exactly once, malformed lines as error lines, cancel, the file size limit.

`start_batch` and `check_batch_complete` are shared with the restart test (a batch that outlives
`llm-serving down` / `up`)."""

from __future__ import annotations

import json
import time
from typing import Any, Final

import openai
import pytest
from openai.types import Batch

from tests.integration.conftest import MODEL, Platform

CHAT: Final = "/v1/chat/completions"
WAIT_S = 600  # bound on one batch's polling (a loaded 2-core CI machine)
POLL_S = 0.5


def chat_line(custom_id: str, max_tokens: int = 1, model: str = MODEL) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Say {custom_id}"}],
        "max_tokens": max_tokens,
    }
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def custom_ids(n_lines: int) -> list[str]:
    return [f"line-{n}" for n in range(n_lines)]


def create_batch(client: openai.OpenAI, rows: list[str]) -> Batch:
    content = "".join(row + "\n" for row in rows).encode()
    file = client.files.create(file=("batch.jsonl", content), purpose="batch")
    return client.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h", metadata={"test": "1"}
    )


def start_batch(client: openai.OpenAI, n_lines: int) -> str:
    """A running batch of `n_lines` one-token chat requests (custom ids line-0, line-1, ...)."""
    batch = create_batch(client, [chat_line(cid) for cid in custom_ids(n_lines)])
    assert batch.status == "in_progress", batch
    return batch.id


def wait_until_ended(client: openai.OpenAI, batch_id: str) -> Batch:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(POLL_S)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {WAIT_S} s: {batch}")


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(row) for row in client.files.content(file_id).text.splitlines()]


def check_batch_complete(client: openai.OpenAI, batch_id: str, n_lines: int) -> Batch:
    """The batch ends completed with exactly one output line per input custom_id (none missing,
    none twice) and no error line."""
    batch = wait_until_ended(client, batch_id)
    assert batch.status == "completed", batch
    output = file_lines(client, batch.output_file_id)
    ids = [row["custom_id"] for row in output]
    assert sorted(ids) == sorted(custom_ids(n_lines)), "output lines differ from the input"
    assert len({row["id"] for row in output}) == n_lines
    assert all(row["response"]["status_code"] == 200 for row in output)
    assert file_lines(client, batch.error_file_id) == []
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {
        "total": n_lines,
        "completed": n_lines,
        "failed": 0,
    }
    return batch


def test_a_batch_of_500_lines_answers_each_line_once_and_bad_lines_are_errors(
    platform: Platform,
) -> None:
    client = platform.client()
    n = 500
    rows = [chat_line(cid) for cid in custom_ids(n)]
    rows.insert(7, '{"custom_id": "broken", "method": "POST", ')  # malformed JSON
    rows.insert(100, chat_line("no-such-model", model="gpt-4o"))
    rows.append(chat_line("line-0"))  # a repeated custom_id
    batch = create_batch(client, rows)
    assert batch.status == "in_progress" and batch.metadata == {"test": "1"}
    ended = wait_until_ended(client, batch.id)
    assert ended.status == "completed" and ended.completed_at and ended.in_progress_at
    output = file_lines(client, ended.output_file_id)
    assert [row["custom_id"] for row in output] == custom_ids(n)  # in input order, each once
    first = output[0]["response"]
    assert first["status_code"] == 200 and first["body"]["object"] == "chat.completion"
    assert first["body"]["usage"]["completion_tokens"] == 1
    errors = file_lines(client, ended.error_file_id)
    assert [(row["custom_id"], row["error"]["code"]) for row in errors] == [
        (None, "invalid_json_line"),
        ("no-such-model", "model_not_found"),
        ("line-0", "duplicate_custom_id"),
    ]
    assert ended.request_counts is not None
    assert ended.request_counts.model_dump() == {"total": n + 3, "completed": n, "failed": 3}
    assert client.files.retrieve(ended.output_file_id or "").purpose == "batch_output"
    listed = [b.id for b in client.batches.list(limit=100)]
    assert batch.id in listed


def test_a_cancelled_batch_stops_and_keeps_its_output_so_far(platform: Platform) -> None:
    client = platform.client()
    n = 300
    batch_id = create_batch(client, [chat_line(cid, max_tokens=2) for cid in custom_ids(n)]).id
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    ended = wait_until_ended(client, batch_id)
    assert ended.status == "cancelled" and ended.cancelled_at
    done = [row["custom_id"] for row in file_lines(client, ended.output_file_id)]
    assert len(done) == len(set(done)) < n and set(done) <= set(custom_ids(n))
    assert ended.request_counts is not None and ended.request_counts.completed == len(done)
    assert client.batches.cancel(batch_id).status == "cancelled"  # stays ended


def test_a_file_over_the_limit_is_a_413_in_openais_shape(platform: Platform) -> None:
    client = platform.client()
    limit = 1024 * 1024  # state.batch.max_file_bytes of the test platform
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (limit + 1)), purpose="batch")
    assert refused.value.status_code == 413
    assert isinstance(refused.value.body, dict)
    assert set(refused.value.body) == {"message", "type", "param", "code"}


def test_an_unrunnable_file_fails_the_batch_with_its_errors(platform: Platform) -> None:
    client = platform.client()
    file = client.files.create(file=("x.jsonl", b"not json\nat all\n"), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "invalid_file"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_none")
    with pytest.raises(openai.BadRequestError) as refused:  # the tiny model makes no embeddings
        client.batches.create(
            input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    assert refused.value.param == "endpoint"

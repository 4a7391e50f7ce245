"""The Batch API's routes over a real store (temp SQLite), through the official `openai` client
on an in-process ASGI transport: OpenAI's objects and error shapes, the file size limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from serving.api.batch_api import BatchRoutes, batch_app
from serving.config.state import BatchSettings, StateConfig
from serving.state.batches import Batches
from serving.state.store import Store

LIMIT = 4096


async def other_app(scope: Scope, receive: Receive, send: Send) -> None:
    """vLLM's app in the tests: it names the path it was given."""
    if scope["type"] == "http":
        await PlainTextResponse(f"vllm {scope['path']}")(scope, receive, send)


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    store = Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}"))
    batches = Batches(store, BatchSettings(max_file_bytes=LIMIT))
    app = BatchRoutes(batch_app(batches, lambda: ({"tiny"}, "tiny", set())), other_app)
    yield TestClient(app, base_url="http://testserver")  # no lifespan: vLLM's app is a stub


@pytest.fixture
def client(http: TestClient) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
    )


def jsonl(n: int) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    rows = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(n)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_files_and_batches_through_the_openai_client(client: openai.OpenAI) -> None:
    file = client.files.create(file=("in.jsonl", jsonl(3)), purpose="batch")
    assert file.object == "file" and file.bytes == len(jsonl(3)) and file.purpose == "batch"
    assert client.files.retrieve(file.id).filename == "in.jsonl"
    assert client.files.content(file.id).content == jsonl(3)
    assert [f.id for f in client.files.list()] == [file.id]
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "1"},
    )
    assert batch.status == "in_progress" and batch.metadata == {"run": "1"}
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert client.batches.retrieve(batch.id).id == batch.id
    assert [b.id for b in client.batches.list(limit=5)] == [batch.id]
    assert client.batches.cancel(batch.id).status == "cancelling"
    assert client.files.delete(file.id).deleted


def test_a_file_over_the_limit_is_a_413(client: openai.OpenAI, http: TestClient) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (LIMIT + 1)), purpose="batch")
    assert refused.value.status_code == 413
    assert refused.value.body["code"] == "file_too_large"  # type: ignore[index]  # the error's fields
    chunked = http.post(
        "/v1/files",
        files={"file": ("big.jsonl", b"x" * (2 * LIMIT + 70_000))},
        data={"purpose": "batch"},
    )
    assert chunked.status_code == 413 and set(chunked.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    # Over the whole body limit too, the refusal names the file limit, not limits.max_body_bytes.
    assert chunked.json()["error"]["code"] == "file_too_large"
    assert "state.batch.max_file_bytes" in chunked.json()["error"]["message"]


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("a.jsonl", b"{}"), purpose="fine-tune")
    assert refused.value.param == "purpose"
    file = client.files.create(file=("a.jsonl", jsonl(1)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    assert refused.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="2d",  # type: ignore[arg-type]  # the client types only "24h"
        )
    assert refused.value.param == "completion_window"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{n}": "v" for n in range(17)},
        )
    assert refused.value.param == "metadata"


def test_other_paths_go_to_vllms_app(http: TestClient) -> None:
    assert http.get("/v1/models").text == "vllm /v1/models"
    assert http.post("/v1/chat/completions", json={}).text == "vllm /v1/chat/completions"
    assert http.get("/v1/batches").json()["object"] == "list"

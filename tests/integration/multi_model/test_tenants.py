"""Two tenants sharing the multi-model endpoint (issue 46), through the model router to the
two-replica model, with the official `openai` client: every cross-tenant access to a stored
response, a file or a batch (and its output) is a 404 and leaves the owner's object as it was;
listings show only one's own; a client-chosen `request_id` never replaces a stored response; a
tenant that may not set `priority` is refused."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.integration.multi_model.conftest import TENANT_KEYS

MODEL = "tiny"  # the example's model with two replicas
SHORT = {"model": MODEL, "max_output_tokens": 4, "temperature": 0.0}


def tenant(endpoint: str, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint, api_key=TENANT_KEYS[name], max_retries=0)


def sessions(n: int) -> list[dict[str, dict[str, str]]]:
    """Request options that spread requests over the model's replicas (session routing)."""
    return [{"extra_headers": {"x-session-id": f"tenants-{i}"}} for i in range(n)]


def test_another_tenants_stored_responses_are_404s_and_cannot_be_replaced(endpoint: str) -> None:
    a, b = tenant(endpoint, "team-a"), tenant(endpoint, "team-b")
    raw = a.responses.with_raw_response.create(input="Hello there", store=True, **SHORT)
    mine = raw.parse()
    replicas = {raw.headers["x-llm-serving-replica"]}
    for options in sessions(4):  # each replica of the model is asked
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(mine.id, **options)
        with pytest.raises(openai.NotFoundError):
            b.responses.create(input="Go on.", previous_response_id=mine.id, **SHORT, **options)
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(mine.id, **options)
        with pytest.raises(openai.NotFoundError):
            b.responses.cancel(mine.id, **options)
        read = a.responses.with_raw_response.retrieve(mine.id, **options)
        replicas.add(read.headers["x-llm-serving-replica"])
    assert len(replicas) >= 2, replicas  # the store, not a replica, holds the response
    for who in (b, a):  # another tenant's id, or one's own: never replaced
        with pytest.raises(openai.ConflictError) as refused:
            who.responses.create(input="Overwrite", extra_body={"request_id": mine.id}, **SHORT)
        assert refused.value.body["param"] == "request_id"
    after = a.responses.retrieve(mine.id)
    assert after.output_text == mine.output_text and after.usage == mine.usage
    follow = a.responses.create(input="Go on.", previous_response_id=mine.id, **SHORT)
    assert follow.previous_response_id == mine.id
    a.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(mine.id)


def batch_file(name: str) -> bytes:
    row = {
        "custom_id": f"{name}-0",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    }
    return (json.dumps(row) + "\n").encode()


def test_another_tenants_files_batches_and_outputs_are_404s_and_not_listed(endpoint: str) -> None:
    a, b = tenant(endpoint, "team-a"), tenant(endpoint, "team-b")
    mine = a.files.create(file=("a.jsonl", batch_file("a")), purpose="batch")
    theirs = b.files.create(file=("b.jsonl", batch_file("b")), purpose="batch")
    batch = a.batches.create(
        input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="1h"
    )
    for _ in range(600):  # bounded: 5 minutes
        batch = a.batches.retrieve(batch.id)
        if batch.status not in ("validating", "in_progress", "finalizing"):
            break
        time.sleep(0.5)
    assert batch.status == "completed" and batch.output_file_id, batch
    for file_id in (mine.id, batch.output_file_id):
        with pytest.raises(openai.NotFoundError):
            b.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            b.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            b.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):  # a batch over another tenant's file
        b.batches.create(
            input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="1h"
        )
    listed = {f.id for f in b.files.list()}  # other tests of this package add b's files too
    assert theirs.id in listed and not {mine.id, batch.output_file_id} & listed
    assert batch.id not in {x.id for x in b.batches.list()}
    assert {mine.id, batch.output_file_id} <= {f.id for f in a.files.list()}
    assert theirs.id not in {f.id for f in a.files.list()}
    assert a.files.content(mine.id).content == batch_file("a")
    output = json.loads(a.files.content(batch.output_file_id).text)
    assert output["custom_id"] == "a-0" and output["response"]["status_code"] == 200


def test_priority_is_refused_to_a_tenant_that_may_not_set_it(endpoint: str) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    with pytest.raises(openai.PermissionDeniedError) as refused:
        tenant(endpoint, "team-b").chat.completions.create(
            **chat, extra_body={"priority": -1000000}
        )
    assert refused.value.body["param"] == "priority"
    with httpx.Client(timeout=60) as http:
        answer = http.post(
            f"{endpoint}/chat/completions",
            json=chat,
            headers={
                "Authorization": f"Bearer {TENANT_KEYS['team-b']}",
                "X-Vllm-Priority": "-1000000",
            },
        )
    assert answer.status_code == 403, answer.text
    allowed = tenant(endpoint, "team-a").chat.completions.create(
        **chat, extra_body={"priority": -5}
    )
    assert allowed.choices[0].message is not None

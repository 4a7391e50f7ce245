"""vLLM's Responses store as views over the platform's store (serving/state/responses.py): a real
Store on a temporary SQLite file, opened twice as two replicas would, under vLLM's own
OpenAIServingResponses methods (its object built without an engine: the generation it would run
is a stand-in coroutine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.config.state import StateConfig
from serving.state import responses as kept
from serving.state.store import Store


def open_two(tmp_path: Path) -> tuple[Store, Store]:
    """Two replicas' stores over one file."""
    config = StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}")
    return Store(config), Store(config)


def a_response(status: str = "completed", text: str = "Paris.", **fields: Any) -> Any:
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    output = [
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]
    return ResponsesResponse.model_validate(
        {
            "id": fields.pop("id", "resp_1"),
            "model": "tiny",
            "output": output if status == "completed" else [],
            "parallel_tool_calls": True,
            "temperature": 0.0,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "background": status != "completed",
            "max_output_tokens": 8,
            "service_tier": "auto",
            "status": status,
            "truncation": "disabled",
            **fields,
        }
    )


def test_a_response_written_by_one_replica_reads_back_whole_on_another(tmp_path: Path) -> None:
    one, other = open_two(tmp_path)
    written = a_response(metadata={"topic": "geography"})
    kept.response_view(one)[written.id] = written
    view = kept.response_view(other)
    assert view[written.id] == written
    assert view.get("resp_none") is None and "resp_none" not in view
    del view[written.id]
    assert kept.response_view(one).get(written.id) is None
    with pytest.raises(KeyError):
        del view[written.id]


def test_chat_messages_keep_every_field_and_part(tmp_path: Path) -> None:
    one, other = open_two(tmp_path)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": "yo",
            "reasoning": "a greeting",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    kept.messages_view(one, harmony=False)["resp_1"] = messages
    assert kept.messages_view(other, harmony=False)["resp_1"] == messages


def test_harmony_messages_read_back_as_harmony_messages(tmp_path: Path) -> None:
    from openai_harmony import Message, Role

    one, other = open_two(tmp_path)
    messages = [
        Message.from_role_and_content(Role.USER, "What is 2+2?"),
        Message.from_role_and_content(Role.ASSISTANT, "4").with_channel("final"),
    ]
    kept.messages_view(one, harmony=True)["resp_1"] = messages
    assert kept.messages_view(other, harmony=True)["resp_1"] == messages


def test_a_view_is_looked_up_not_listed(tmp_path: Path) -> None:
    view = kept.response_view(open_two(tmp_path)[0])
    with pytest.raises(TypeError, match="not listed"):
        list(view)


def test_the_ttl_of_the_store_expires_a_stored_response(tmp_path: Path) -> None:
    store = Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}", ttl_s=0.01))
    view = kept.response_view(store)
    view["resp_1"] = a_response()
    time.sleep(0.05)
    assert view.get("resp_1") is None


# -- vLLM's serving object on the views ------------------------------------------------------------


def vllm_serving(store: Store, replica: str, generate: Callable[..., Any]) -> tuple[Any, FastAPI]:
    """vLLM's OpenAIServingResponses with what its __init__ sets for the store (no engine):
    `generate` stands in for responses_full_generator. Kept as the replica's app keeps it."""
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

    serving = object.__new__(OpenAIServingResponses)
    serving.enable_store = False  # vLLM's default: keep_responses turns it on
    serving.use_harmony = False
    serving.response_store, serving.response_store_lock = {}, asyncio.Lock()
    serving.msg_store, serving.event_store, serving.background_tasks = {}, {}, {}
    serving.responses_full_generator = generate
    app = FastAPI()
    app.state.openai_serving_responses = serving
    kept.keep_responses(app, store, replica)
    return serving, app


def start_background(serving: Any, response: Any) -> asyncio.Task:
    """What vLLM's _create_responses does for `background: true`: store it queued, run it."""

    class Request:
        request_id = response.id

    serving.response_store[response.id] = response
    task = asyncio.create_task(serving._run_background_request(Request()))
    serving.background_tasks[response.id] = task
    task.add_done_callback(lambda _: serving.background_tasks.pop(response.id, None))
    return task


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def test_a_cancel_on_another_replica_cancels_the_run_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kept, "WATCH_EVERY_S", 0.02)
    store_a, store_b = open_two(tmp_path)
    generating = asyncio.Event()
    ended: list[str] = []

    async def generate(*_: Any) -> Any:
        generating.set()
        try:
            await asyncio.Event().wait()  # the engine request, until cancelled
        except asyncio.CancelledError:
            ended.append("aborted")  # vLLM's generate aborts the engine request here
            raise

    serving_a, _ = vllm_serving(store_a, "replica-a", generate)
    serving_b, _ = vllm_serving(store_b, "replica-b", generate)
    task = start_background(serving_a, a_response("queued", id="resp_bg"))
    await generating.wait()
    await until(lambda: store_b.get(kept.RUN, "resp_bg") is not None)  # the watcher's first beat
    beat = json.loads(store_b.get(kept.RUN, "resp_bg") or b"{}")
    assert beat["owner"] == "replica-a"

    answer = await serving_b.cancel_responses("resp_bg")
    assert answer.status == "cancelled"
    await until(task.done)
    assert ended == ["aborted"]
    assert serving_a.response_store["resp_bg"].status == "cancelled"
    assert store_a.get(kept.RUN, "resp_bg") is None  # the run's heartbeat went with it
    again = await serving_b.cancel_responses("resp_bg")  # vLLM's own refusal now
    assert again.error.code == 400


async def test_a_cancel_on_the_running_replica_aborts_at_once(tmp_path: Path) -> None:
    store, _ = open_two(tmp_path)
    generating, ended = asyncio.Event(), []

    async def generate(*_: Any) -> Any:
        generating.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("aborted")
            raise

    serving, _ = vllm_serving(store, "replica-a", generate)
    task = start_background(serving, a_response("queued", id="resp_bg"))
    await generating.wait()
    assert (await serving.cancel_responses("resp_bg")).status == "cancelled"
    assert task.done() and ended == ["aborted"]
    assert serving.response_store["resp_bg"].status == "cancelled"


async def test_a_failed_background_run_is_failed_in_the_store(tmp_path: Path) -> None:
    from vllm.entrypoints.serve import create_error_response

    store, other = open_two(tmp_path)

    async def generate(*_: Any) -> Any:
        return create_error_response("the engine failed")

    serving, _ = vllm_serving(store, "replica-a", generate)
    await start_background(serving, a_response("queued", id="resp_bg"))
    failed = kept.response_view(other)["resp_bg"]
    assert failed.status == "failed"
    assert failed.model_dump()["error"]["code"] == "server_error"


async def test_a_run_that_raises_fails_with_its_error(tmp_path: Path) -> None:
    store, _ = open_two(tmp_path)

    async def generate(*_: Any) -> Any:
        raise RuntimeError("engine dead")

    serving, _ = vllm_serving(store, "replica-a", generate)
    await start_background(serving, a_response("queued", id="resp_bg"))
    failed = serving.response_store["resp_bg"]
    assert failed.status == "failed" and "engine dead" in failed.model_dump()["error"]["message"]


async def test_a_run_whose_replica_stopped_is_failed_when_retrieved(tmp_path: Path) -> None:
    store, other = open_two(tmp_path)
    serving, _ = vllm_serving(other, "replica-b", lambda *_: None)
    lost = a_response("queued", id="resp_lost", created_at=int(time.time()) - 60)
    kept.response_view(store)["resp_lost"] = lost
    store.put(kept.RUN, "resp_lost", json.dumps({"owner": "gone", "beat_at": 0}).encode())
    fresh = a_response("queued", id="resp_fresh")  # just created: its run has not beaten yet
    kept.response_view(store)["resp_fresh"] = fresh

    failed = await serving.retrieve_responses("resp_lost", None, False)
    assert failed.status == "failed" and "stopped" in failed.model_dump()["error"]["message"]
    assert (await serving.retrieve_responses("resp_fresh", None, False)).status == "queued"


async def test_streaming_another_replicas_background_response_is_a_400(tmp_path: Path) -> None:
    serving, _ = vllm_serving(open_two(tmp_path)[0], "replica-b", lambda *_: None)
    serving.response_store["resp_1"] = a_response()
    refused = await serving.retrieve_responses("resp_1", None, True)
    assert refused.error.code == 400 and refused.error.param == "stream"
    missing = await serving.retrieve_responses("resp_none", None, True)
    assert missing.error.code == 404


def test_delete_answers_as_openai_and_then_404(tmp_path: Path) -> None:
    store, other = open_two(tmp_path)
    serving, app = vllm_serving(store, "replica-a", lambda *_: None)
    assert serving.enable_store
    serving.response_store["resp_1"] = a_response()
    serving.msg_store["resp_1"] = [{"role": "user", "content": "hi"}]
    with TestClient(app) as client:
        deleted = client.delete("/v1/responses/resp_1")
        assert deleted.status_code == 200
        assert deleted.json() == {"id": "resp_1", "object": "response", "deleted": True}
        assert other.get(kept.RESPONSE, "resp_1") is None
        assert other.get(kept.MESSAGES, "resp_1") is None
        again = client.delete("/v1/responses/resp_1")
    assert again.status_code == 404
    assert set(again.json()["error"]) == {"message", "type", "param", "code"}


async def test_background_runs_over_the_replicas_cap_are_a_429(tmp_path: Path) -> None:
    """A background run holds no connection, so the replica bounds how many run at once:
    state.max_background_responses, then a 429 naming the limit; others pass to vLLM's create."""
    store, _ = open_two(tmp_path)
    serving, app = vllm_serving(store, "replica-a", lambda *_: asyncio.Event().wait())
    created: list[Any] = []

    async def vllm_create(request: Any, *_: Any) -> str:
        created.append(request)
        return "created"

    cap = kept.KeptResponses(serving, store, "replica-a", kept.response_view(store), 1)

    class Request:
        def __init__(self, background: bool) -> None:
            self.background = background

    assert await cap.create(vllm_create, Request(True)) == "created"  # none runs yet
    task = start_background(serving, a_response("queued", id="resp_bg"))
    refused = await cap.create(vllm_create, Request(True))
    assert refused.error.code == 429 and refused.error.param == "background"
    assert "state.max_background_responses=1" in refused.error.message
    assert await cap.create(vllm_create, Request(False)) == "created"  # foreground: not counted
    assert len(created) == 2
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

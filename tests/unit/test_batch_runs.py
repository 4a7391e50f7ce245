"""Batches over a real store (a temp SQLite file): validation, runners that claim and finish
lines, finalization by exactly one runner, cancel, expiry, and lines of a runner that died.
Only the replica's app is replaced (`run`), by a function that answers like vLLM's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from serving.config.state import BatchSettings, StateConfig
from serving.state import batches as batches_module
from serving.state.batch_runner import BatchRunner
from serving.state.batches import BatchAPIError, Batches
from serving.state.store import Store
from serving.state.tables import owners

CHAT = "/v1/chat/completions"
MODELS = {"tiny", "tiny-lora"}


def line(custom_id: str, model: str = "tiny", max_tokens: int = 1) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": CHAT,
            "body": body | {"max_tokens": max_tokens},
        }
    )


@pytest.fixture
def batches(tmp_path: Path) -> Batches:
    store = Store(StateConfig(url=f"sqlite:///{tmp_path / 'state.db'}"))
    return Batches(store, BatchSettings(concurrency=3, max_lines=1000))


def start(batches: Batches, rows: list[str], window: str = "24h") -> str:
    file = batches.create_file("in.jsonl", "batch", "\n".join(rows).encode())
    batch = batches.create_batch(file.id, CHAT, window, {"k": "v"}, MODELS, "tiny")
    return batch.id


class Engine:
    """Answers like vLLM's app: 200 with a completion, 400 for max_tokens over 100."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, url: str, body: dict[str, Any]) -> tuple[int, Any, str]:
        await self.gate.wait()
        self.bodies.append(body)
        if body["max_tokens"] > 100:
            return (
                400,
                {"error": {"message": "too long", "type": "BadRequestError", "code": 400}},
                "r",
            )
        rid = f"chatcmpl-{len(self.bodies)}"
        return 200, {"id": rid, "object": "chat.completion", "model": body["model"]}, rid


def runner(batches: Batches, engine: Engine, owner: str = "r1", online: int = 0) -> BatchRunner:
    """A runner over `engine`, which also serves `online` requests of its own."""
    batches.store.beat(owner)  # as its loop does first
    made = BatchRunner(batches, owner, lambda: set(MODELS), engine.run, lambda: online)
    made.in_engine = lambda: online + len(made.held)
    return made


async def drained(runner: BatchRunner, rounds: int = 500) -> None:
    """Until the runner's lines in flight have ended and stored their results (bounded)."""
    for _ in range(rounds):
        if not runner.held:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"lines still in flight: {list(runner.held.values())}")


async def settle(runner: BatchRunner, batches: Batches, id: str, rounds: int = 50) -> str:
    for _ in range(rounds):
        await runner.step()
        await asyncio.sleep(0.01)
        status = batches.stored(id).status
        if status in ("completed", "failed", "expired", "cancelled"):
            return status
    return batches.stored(id).status


def output(batches: Batches, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(row) for row in batches.file_content(file_id).decode().splitlines()]


async def test_a_batch_runs_every_line_once_and_ends_completed(batches: Batches) -> None:
    rows = [line(f"c{n}") for n in range(7)] + ["{bad", line("big", max_tokens=500)]
    id = start(batches, rows)
    assert batches.batch(id).status == "in_progress"
    engine = Engine()
    assert await settle(runner(batches, engine), batches, id) == "completed"
    batch = batches.batch(id)
    assert batch.request_counts is not None and batch.output_file_id is not None
    assert batch.request_counts.model_dump() == {"total": 9, "completed": 7, "failed": 2}
    assert batch.completed_at and batch.in_progress_at and batch.finalizing_at
    # the lines are gone once the files hold their results (they count toward no cap)
    assert sum(batches.store.line_counts(id).values()) == 0
    done = output(batches, batch.output_file_id)
    assert [row["custom_id"] for row in done] == [f"c{n}" for n in range(7)]
    assert all(row["response"]["status_code"] == 200 and row["error"] is None for row in done)
    errors = output(batches, batch.error_file_id)
    assert [(row["custom_id"], row["error"]["code"]) for row in errors] == [
        (None, "invalid_json_line"),
        ("big", 400),
    ]
    assert all(body["priority"] == 10 and body["stream"] is False for body in engine.bodies)
    assert len(engine.bodies) == 8
    assert batches.file(batch.output_file_id).purpose == "batch_output"


@pytest.mark.parametrize(("online", "started"), [(0, 3), (1, 2), (3, 0), (6, 0)])
async def test_online_requests_take_the_batchs_slots(
    batches: Batches, online: int, started: int
) -> None:
    id = start(batches, [line(f"a{n}") for n in range(8)])
    engine = Engine()
    engine.gate.clear()  # lines stay in flight: the slots they take are counted
    made = runner(batches, engine, online=online)
    assert made.concurrency == 3
    await made.step()
    await asyncio.sleep(0.01)
    assert len(made.held) == started
    assert batches.store.line_counts(id)["pending"] == 8 - started
    made.stop()


async def test_runners_share_lines_and_only_one_finalizes(batches: Batches) -> None:
    id = start(batches, [line(f"c{n}") for n in range(20)])
    engine = Engine()
    one, two = runner(batches, engine, "r1"), runner(batches, engine, "r2")
    for _ in range(40):
        await asyncio.gather(one.step(), two.step())
        await asyncio.sleep(0.01)
    batch = batches.batch(id)
    assert batch.status == "completed"
    ids = [row["custom_id"] for row in output(batches, batch.output_file_id)]
    assert ids == [f"c{n}" for n in range(20)] and len(engine.bodies) == 20
    assert not batches.finalize(batches.stored(id))  # already ended: nobody finalizes twice


async def test_lines_of_a_runner_that_died_run_again_exactly_once(batches: Batches) -> None:
    id = start(batches, [line(f"c{n}") for n in range(4)])
    store = batches.store
    store.beat("dead")
    held = store.claim(id, MODELS, "dead", 2)
    with store.engine.begin() as conn:  # its last beat is long ago
        conn.execute(update(owners).where(owners.c.id == "dead").values(seen_at=0.0))
    engine = Engine()
    assert await settle(runner(batches, engine), batches, id) == "completed"
    assert not store.finish(id, held[0].line, True, "{}")  # the dead one's late answer is dropped
    rows = output(batches, batches.batch(id).output_file_id)
    assert sorted(row["custom_id"] for row in rows) == ["c0", "c1", "c2", "c3"]


async def test_cancel_stops_new_lines_and_keeps_the_output_so_far(batches: Batches) -> None:
    id = start(batches, [line(f"c{n}") for n in range(10)])
    engine = Engine()
    run = runner(batches, engine)
    await run.step()  # three lines start (concurrency 3)
    await drained(run)
    engine.gate.clear()
    await run.step()  # three more start and wait at the gate
    cancelling = batches.cancel(id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    await run.step()
    assert batches.stored(id).status == "cancelling"  # lines still in flight
    engine.gate.set()
    assert await settle(run, batches, id) == "cancelled"
    batch = batches.batch(id)
    assert batch.cancelled_at and batch.request_counts is not None
    assert batch.request_counts.completed == 6
    assert len(output(batches, batch.output_file_id)) == 6
    assert batches.cancel(id).status == "cancelled"  # an ended batch stays as it is


async def test_a_passed_window_expires_the_lines_not_run(batches: Batches) -> None:
    id = start(batches, [line(f"c{n}") for n in range(3)], window="1m")
    stored = batches.stored(id)
    batches.save(stored.model_copy(update={"expires_at": 0}))
    engine = Engine()
    assert await settle(runner(batches, engine), batches, id) == "expired"
    batch = batches.batch(id)
    assert batch.expired_at and batch.output_file_id is None and engine.bodies == []
    errors = output(batches, batch.error_file_id)
    assert [row["error"]["code"] for row in errors] == ["batch_expired"] * 3
    assert [row["custom_id"] for row in errors] == ["c0", "c1", "c2"]


def test_an_unrunnable_file_fails_the_batch(batches: Batches) -> None:
    file = batches.create_file("x.jsonl", "batch", b"no json here")
    batch = batches.create_batch(file.id, CHAT, "24h", None, MODELS, "tiny")
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].code == "invalid_file"


def test_bad_batch_requests_are_refused(batches: Batches) -> None:
    file = batches.create_file("x.jsonl", "batch", line("a").encode())
    with pytest.raises(BatchAPIError) as refused:
        batches.create_batch(file.id, "/v1/responses", "24h", None, MODELS, "tiny")
    assert refused.value.param == "endpoint"
    with pytest.raises(BatchAPIError) as refused:
        batches.create_batch(file.id, "/v1/embeddings", "24h", None, MODELS, "tiny", set())
    assert "embeddings" in refused.value.message
    with pytest.raises(BatchAPIError) as refused:
        batches.create_batch("file-nope", CHAT, "24h", None, MODELS, "tiny")
    assert refused.value.status == 404


def test_files_list_read_and_delete(batches: Batches) -> None:
    first = batches.create_file("a.jsonl", "batch", b"1")
    second = batches.create_file("b.jsonl", "batch", b"22")
    assert [f.id for f in batches.files(10, None, None)] == [second.id, first.id]
    assert [f.id for f in batches.files(10, second.id, None)] == [first.id]
    assert batches.file_content(second.id) == b"22" and batches.file(second.id).bytes == 2
    assert batches.delete_file(first.id).deleted
    with pytest.raises(BatchAPIError):
        batches.file(first.id)


def test_a_running_batch_and_its_input_are_pinned_until_it_ends(batches: Batches) -> None:
    id = start(batches, [line("a")])
    input_id = batches.stored(id).input_file_id
    batches.store.max_bytes = 0  # everything unpinned goes
    batches.store.evict()
    assert batches.stored(id).status == "in_progress" and batches.file_content(input_id)


def test_put_if_swaps_only_from_the_expected_tag(tmp_path: Path) -> None:
    store = Store(StateConfig(url=f"sqlite:///{tmp_path / 's.db'}"))
    store.put("batch", "b", b"1", tag="in_progress")
    assert store.put_if("batch", "b", b"2", "finalizing", "in_progress")
    assert not store.put_if("batch", "b", b"3", "finalizing", "in_progress")
    assert store.get("batch", "b") == b"2"


async def test_a_stopping_runner_gives_its_lines_back(batches: Batches) -> None:
    id = start(batches, [line(f"c{n}") for n in range(5)])
    engine = Engine()
    engine.gate.clear()  # the lines it starts wait in the engine
    run = runner(batches, engine)
    await run.step()
    assert batches.store.line_counts(id)["claimed"] == 3
    run.stop()
    assert batches.store.line_counts(id) == {
        "pending": 5,
        "claimed": 0,
        "completed": 0,
        "failed": 0,
    }
    other = runner(batches, Engine(), "r2")
    assert await settle(other, batches, id) == "completed"


async def test_a_batch_whose_validation_stopped_fails(batches: Batches) -> None:
    id = start(batches, [line("a")])
    stored = batches.stored(id)
    batches.save(stored.model_copy(update={"status": "validating", "created_at": 0}))
    assert await settle(runner(batches, Engine()), batches, id) == "failed"
    batch = batches.batch(id)
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].code == "validation_interrupted" and batch.failed_at


async def test_a_batch_cancelled_while_it_validates_stays_cancelled(
    batches: Batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = batches.create_file("in.jsonl", "batch", line("a").encode())
    parse = batches_module.parse_input

    def cancel_then_parse(*args: Any) -> Any:  # the cancel lands while the file is read
        batches.cancel(batches.batches(1, None)[0].id)
        return parse(*args)

    monkeypatch.setattr(batches_module, "parse_input", cancel_then_parse)
    batch = batches.create_batch(file.id, CHAT, "24h", None, MODELS, "tiny")
    assert batch.status == "cancelling"
    assert await settle(runner(batches, Engine()), batches, batch.id) == "cancelled"

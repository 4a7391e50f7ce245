"""The platform's store on both backends: SQLite (a temp file) and a real PostgreSQL server
(tests/postgres.py) reached with a password from the environment. Time is the store modules'
clock, set by the test, so TTLs and stale runners need no waiting."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from serving.config.state import StateConfig
from serving.state import line_store
from serving.state import store as store_module
from serving.state.store import Store
from serving.state.tables import metadata
from tests.postgres import Postgres

PASSWORD_ENV = "LLM_SERVING_TEST_STATE_PASSWORD"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(store_module, "time", clock)
    monkeypatch.setattr(line_store, "time", clock)
    return clock


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Store]]:
    """Stores over one fresh database: make_store(ttl_s=..., max_bytes=...)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        server: Postgres = request.getfixturevalue("postgres")
        monkeypatch.setenv(PASSWORD_ENV, server.password)
        url = server.url
    made: list[Store] = []

    def make(**settings: Any) -> Store:
        made.append(Store(StateConfig(url=url, password_env=PASSWORD_ENV, **settings)))
        return made[-1]

    yield make
    if made:
        metadata.drop_all(made[0].engine)
    for store in made:
        store.engine.dispose()


@pytest.fixture
def store(make_store: Callable[..., Store], clock: Clock) -> Store:
    return make_store()


def test_a_record_is_written_read_overwritten_and_deleted(store: Store) -> None:
    store.put("response", "r1", b'{"a": 1}')
    assert store.get("response", "r1") == b'{"a": 1}'
    assert isinstance(store.get("response", "r1"), bytes)
    store.put("response", "r1", b'{"a": 2}')
    assert store.get("response", "r1") == b'{"a": 2}'
    assert store.get("file", "r1") is None  # kinds are separate
    assert store.delete("response", "r1") is True
    assert store.get("response", "r1") is None
    assert store.delete("response", "r1") is False


def test_newest_lists_newest_first_and_pages_after_an_id(store: Store, clock: Clock) -> None:
    for n in range(5):
        clock.now += 1
        store.put("batch", f"b{n}", f"{n}".encode())
    assert store.newest("batch", 3) == [b"4", b"3", b"2"]
    assert store.newest("batch", 3, after="b2") == [b"1", b"0"]
    assert store.newest("batch", 3, after="missing") == []


def test_records_written_in_one_tick_page_without_loss(store: Store, clock: Clock) -> None:
    for n in range(4):
        store.put("batch", f"b{n}", f"{n}".encode())
    first = store.newest("batch", 2)
    rest = store.newest("batch", 2, after=id_of(first[-1]))
    assert sorted(first + rest) == [b"0", b"1", b"2", b"3"]


def id_of(body: bytes) -> str:
    return f"b{body.decode()}"


def test_a_record_expires_after_its_ttl(make_store: Callable[..., Store], clock: Clock) -> None:
    store = make_store(ttl_s=60)
    store.put("response", "old", b"x")
    clock.now += 61
    assert store.get("response", "old") is None
    assert store.newest("response", 10) == []
    assert store.evict() == 1
    assert store.total_bytes() == 0


def test_a_pinned_record_outlives_its_ttl(make_store: Callable[..., Store], clock: Clock) -> None:
    store = make_store(ttl_s=60)
    store.put("file", "input", b"lines")
    store.pin("file", "input", True)
    clock.now += 61
    assert store.evict() == 0
    assert store.get("file", "input") == b"lines"
    store.pin("file", "input", False)
    assert store.evict() == 1
    assert store.get("file", "input") is None


def test_over_the_cap_the_oldest_go_and_pinned_records_stay(
    make_store: Callable[..., Store], clock: Clock
) -> None:
    store = make_store(max_bytes=1000)
    for n in range(5):
        clock.now += 1  # within one sweep interval: only the first put sweeps
        store.put("file", f"f{n}", bytes(300))
    store.pin("file", "f0", True)
    assert store.evict() == 2  # 1500 bytes: f1 and f2 go; pinned f0 stays
    assert [n for n in range(5) if store.get("file", f"f{n}")] == [0, 3, 4]
    assert store.total_bytes() == 900


def test_expired_records_count_toward_the_cap_only_until_deleted(
    make_store: Callable[..., Store], clock: Clock
) -> None:
    store = make_store(max_bytes=1000, ttl_s=60)
    store.put("file", "expired", bytes(400))
    clock.now += 30
    store.put("file", "live1", bytes(300))
    clock.now += 1
    store.put("file", "live2", bytes(400))
    clock.now += 30  # "expired" is past its TTL; 1100 bytes in all, 700 of them live
    assert store.evict() == 1
    assert store.get("file", "live1") is not None
    assert store.total_bytes() == 700


def test_a_deleted_batch_takes_its_lines(store: Store) -> None:
    store.put("batch", "b", b"{}")
    store.add_lines("b", [(0, "m", "{}")])
    store.delete("batch", "b")
    assert store.unfinished("b") == []


def test_two_runners_never_hold_one_line(store: Store) -> None:
    store.add_lines("b", [(n, "m", f'{{"n": {n}}}') for n in range(10)])
    store.beat("r1")
    store.beat("r2")
    first = store.claim("b", {"m"}, "r1", 6)
    second = store.claim("b", {"m"}, "r2", 6)
    assert [line.line for line in first] == [0, 1, 2, 3, 4, 5]
    assert [line.line for line in second] == [6, 7, 8, 9]
    assert store.claim("b", {"other"}, "r2", 5) == []
    assert store.line_counts("b") == {"pending": 0, "claimed": 10, "completed": 0, "failed": 0}


def test_a_gone_runners_lines_are_reclaimed(store: Store, clock: Clock) -> None:
    store.add_lines("b", [(n, "m", "{}") for n in range(3)])
    store.beat("gone")
    assert len(store.claim("b", {"m"}, "gone", 3)) == 3
    clock.now += line_store.OWNER_STALE_S / 2
    store.beat("alive")
    assert store.claim("b", {"m"}, "alive", 3) == []  # "gone" beat recently: still its lines
    clock.now += line_store.OWNER_STALE_S
    store.beat("alive")
    assert [line.line for line in store.claim("b", {"m"}, "alive", 3)] == [0, 1, 2]


def test_a_line_is_finished_once(store: Store) -> None:
    store.add_lines("b", [(0, "m", "{}"), (1, "m", "{}")])
    assert store.finish("b", 0, True, "first") is True
    assert store.finish("b", 0, False, "second") is False
    assert store.finish("b", 1, False, "error") is True
    assert list(store.results("b")) == [(0, True, "first"), (1, False, "error")]
    assert store.unfinished("b") == []
    assert store.line_counts("b")["completed"] == 1
    assert store.line_counts("b")["failed"] == 1


def test_a_released_line_is_pending_again(store: Store) -> None:
    store.add_lines("b", [(0, "m", "{}")])
    store.beat("r")
    store.claim("b", {"m"}, "r", 1)
    store.release("b", 0, "r")
    assert store.line_counts("b")["pending"] == 1


def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            results[n] = target(n)
        except BaseException as error:  # noqa: BLE001 -- re-raised below in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


def test_concurrent_runners_claim_every_line_exactly_once(store: Store) -> None:
    store.add_lines("b", [(n, "m", "{}") for n in range(200)])

    def runner(n: int) -> list[int]:
        owner = f"r{n}"
        store.beat(owner)
        taken: list[int] = []
        for _ in range(100):  # bounded: 200 lines in chunks of 7 take far fewer rounds
            lines = store.claim("b", {"m"}, owner, 7)
            if not lines:
                break
            taken += [line.line for line in lines]
        return taken

    claimed = [line for lines in run_threads(6, runner) for line in lines]
    assert sorted(claimed) == list(range(200))


def test_concurrent_finishes_keep_one_result(store: Store) -> None:
    store.add_lines("b", [(0, "m", "{}")])
    won = run_threads(8, lambda n: store.finish("b", 0, True, f"result {n}"))
    assert won.count(True) == 1
    assert len(list(store.results("b"))) == 1


def test_concurrent_writers_of_one_new_record_all_succeed(store: Store) -> None:
    def write(n: int) -> None:
        for record in range(30):
            store.put("batch", f"b{record}", f"{n}".encode())

    run_threads(6, write)
    assert store.get("batch", "b29") in {f"{n}".encode() for n in range(6)}


def test_replicas_starting_together_on_a_new_database(
    make_store: Callable[..., Store],
) -> None:
    stores = run_threads(6, lambda n: make_store())
    stores[0].put("response", "r", b"x")
    assert stores[-1].get("response", "r") == b"x"


def test_the_password_comes_from_the_environment_only(
    postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="password"):
        StateConfig(url=f"postgresql+psycopg://llm:{postgres.password}@127.0.0.1:1/llm")
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    with pytest.raises(sqlalchemy.exc.OperationalError, match="password authentication failed"):
        Store(StateConfig(url=postgres.url, password_env=PASSWORD_ENV))


def test_a_process_keeps_two_connections_and_bursts_to_eight(
    postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many replicas share one server: each process's pool keeps 2 connections between bursts
    and opens at most 8 (2 + 6 overflow), as the server counts them."""
    monkeypatch.setenv(PASSWORD_ENV, postgres.password)
    store = Store(StateConfig(url=postgres.url, password_env=PASSWORD_ENV))
    barrier = threading.Barrier(8)

    def hold(_: int) -> int:
        with store.engine.connect():
            barrier.wait(timeout=60)  # all 8 connections open at once
            count = server_connections(postgres)
            barrier.wait(timeout=60)
            return count

    try:
        assert run_threads(8, hold) == [8] * 8
        pool = store.engine.pool
        assert isinstance(pool, sqlalchemy.QueuePool)
        assert (pool.size(), pool.overflow(), pool.checkedin()) == (2, 0, 2)
    finally:
        metadata.drop_all(store.engine)
        store.engine.dispose()


def server_connections(postgres: Postgres) -> int:
    with postgres.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'llm-serving'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_tenant_reads_lists_and_deletes_only_its_records(
    make_store: Callable[..., Store],
) -> None:
    store = make_store()
    store.put("file", "f-a", b"a's", tenant="team-a")
    store.put("file", "f-b", b"b's", tenant="team-b")
    assert store.get("file", "f-a", "team-a") == b"a's"
    assert store.get("file", "f-a", "team-b") is None
    assert store.get("file", "f-a") == b"a's"  # the platform's own reads see every tenant's
    assert store.newest("file", 10, tenant="team-b") == [b"b's"]
    assert sorted(store.newest("file", 10)) == [b"a's", b"b's"]
    assert store.newest("file", 10, after="f-a", tenant="team-b") == []  # not b's cursor
    assert not store.delete("file", "f-a", "team-b")
    assert store.get("file", "f-a", "team-a") == b"a's"
    assert store.delete("file", "f-a", "team-a") and store.get("file", "f-a") is None


def test_a_record_never_passes_to_another_tenant(make_store: Callable[..., Store]) -> None:
    store = make_store()
    assert store.put("response", "resp_1", b"mine", tenant="team-a")
    assert not store.put("response", "resp_1", b"theirs", tenant="team-b")
    assert store.owner("response", "resp_1") == "team-a"
    assert store.get("response", "resp_1") == b"mine"
    assert store.put("response", "resp_1", b"mine, later", tenant="team-a")
    assert store.get("response", "resp_1", "team-a") == b"mine, later"


def test_an_older_store_gets_the_tenant_column(tmp_path: Path) -> None:
    """A store made before tenants (records without `tenant`): its records become the default
    tenant's when a replica of this version opens it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                "CREATE TABLE records (kind VARCHAR(32), id VARCHAR(128), body BLOB NOT NULL, "
                "size INTEGER NOT NULL, tag VARCHAR(32), pinned BOOLEAN NOT NULL, "
                "created_at FLOAT NOT NULL, expires_at FLOAT NOT NULL, PRIMARY KEY (kind, id))"
            )
        )
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO records VALUES ('file', 'old', x'6f6c64', 3, NULL, 0, 1, 9e18)"
            )
        )
    store = Store(StateConfig(url=url))
    assert store.owner("file", "old") == "default"
    assert store.get("file", "old", "default") == b"old"


def test_over_the_cap_the_heaviest_tenant_loses_its_oldest_first() -> None:
    oldest = [
        ("file", "a1", 10, "team-a"),  # the oldest record of all, of the lighter tenant
        ("file", "b1", 10, "team-b"),
        ("file", "b2", 10, "team-b"),
        ("file", "b3", 10, "team-b"),
        ("file", "a2", 10, "team-a"),
    ]
    assert store_module.heaviest_first(oldest, 10) == [("file", "b1")]
    assert store_module.heaviest_first(oldest, 35) == [
        ("file", "b1"),
        ("file", "a1"),  # both tenants hold 20 now: the older record goes
        ("file", "b2"),
        ("file", "b3"),
    ]
    assert store_module.heaviest_first(oldest, 0) == []


def test_eviction_spares_the_lighter_tenant(make_store: Callable[..., Store], clock: Clock) -> None:
    store = make_store(max_bytes=100)
    store.put("file", "a-old", b"a" * 30, tenant="team-a")
    clock.now += 1
    for n in range(4):
        store.put("file", f"b{n}", b"b" * 30, tenant="team-b")
        clock.now += 1
    assert store.evict() == 2  # 150 bytes: team-b's two oldest go, team-a's older one stays
    assert store.get("file", "a-old") is not None
    assert [store.get("file", f"b{n}") is None for n in range(4)] == [True, True, False, False]

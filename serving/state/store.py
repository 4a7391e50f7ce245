"""The platform's store: records (stored responses, their messages, files, batches) and batch
lines, in SQLite on one machine or PostgreSQL on a cluster, through SQLAlchemy Core (the same
statements on both). Every record expires `ttl_s` after it was written and the oldest go first
when the store is over `max_bytes`; a pinned record (a running batch, its input file) stays.

Calls block (SQLite file I/O, a PostgreSQL round trip): async code runs them in a thread
(`asyncio.to_thread`), except where vLLM's serving layer reads its store as a dict."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    and_,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from serving.models import cache_root
from serving.state_config import StateConfig

metadata = MetaData()
records = Table(
    "records",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("body", LargeBinary, nullable=False),
    Column("size", Integer, nullable=False),
    Column("tag", String(32), nullable=True),  # a batch's status, to find the running ones
    Column("pinned", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
)
batch_lines = Table(
    "batch_lines",
    metadata,
    Column("batch_id", String(128), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("model", String(256), nullable=False),
    Column("request", Text, nullable=False),
    Column("state", String(16), nullable=False, index=True),  # pending | claimed | done
    Column("owner", String(128), nullable=True),
    Column("ok", Boolean, nullable=True),
    Column("result", Text, nullable=True),
)
owners = Table(
    "owners",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("seen_at", Float, nullable=False),
)

OWNER_STALE_S = 15.0  # a runner that has not beaten for this long is gone: its lines go back
EVICT_EVERY_S = 10.0


def default_url() -> str:
    """The embedded store: one SQLite file that every replica on this machine opens."""
    return f"sqlite:///{cache_root() / 'state.db'}"


def engine_for(config: StateConfig) -> Engine:
    url = make_url(config.url or default_url())
    password = os.environ.get(config.password_env or "") or None
    if password is not None and url.get_backend_name() == "postgresql":
        url = url.set(password=password)
    if url.get_backend_name() == "sqlite":
        if url.database:
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", sqlite_pragmas)
        return engine
    # Every process (each vLLM replica, each router replica) holds its own pool: 2 connections kept,
    # up to 8 in a burst, so the server sees at most 8 per process (the chart's PostgreSQL allows
    # state.postgresql.maxConnections). pre_ping and recycle drop connections the server or a proxy
    # closed (a database restart or failover) instead of failing a request on them.
    return create_engine(
        url,
        pool_size=2,
        max_overflow=6,
        pool_timeout=30,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": 10, "application_name": "llm-serving"},
    )


def create_tables(engine: Engine) -> None:
    """Replicas that start together on a new database race to create the tables: a loser's
    CREATE fails (already exists, after the winner committed) and its next try finds them."""
    attempts = len(metadata.tables) + 1
    for attempt in range(attempts):
        try:
            metadata.create_all(engine)
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise


def upsert(engine: Engine, table: Table, values: dict[str, Any], update_keys: list[str]) -> Any:
    """INSERT ... ON CONFLICT DO UPDATE: one statement, so concurrent writers of one new key
    never collide (an UPDATE-then-INSERT lets two of them INSERT)."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).values(**values)
    keys = [column.name for column in table.primary_key]
    return statement.on_conflict_do_update(
        index_elements=keys, set_={key: statement.excluded[key] for key in update_keys}
    )


def alive(now: float) -> ColumnElement[bool]:
    """Not expired, or pinned (a running batch's records outlive their TTL until unpinned)."""
    return or_(records.c.expires_at > now, records.c.pinned.is_(True))


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL: readers in other replicas' processes do not block a writer."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@dataclass(frozen=True)
class Line:
    batch_id: str
    line: int
    model: str
    request: str


class Store:
    def __init__(self, config: StateConfig, engine: Engine | None = None) -> None:
        self.ttl_s = config.ttl_s
        self.max_bytes = config.max_bytes
        self.engine = engine or engine_for(config)
        create_tables(self.engine)
        self._last_evict = 0.0
        self._evict_lock = threading.Lock()

    # -- records --------------------------------------------------------------------------------

    def put(self, kind: str, id: str, body: bytes, tag: str | None = None) -> None:
        """Write a record (a new one or over the old), expiring ttl_s from now."""
        now = time.time()
        values = {"body": body, "size": len(body), "tag": tag, "expires_at": now + self.ttl_s}
        row = {"kind": kind, "id": id, "pinned": False, "created_at": now, **values}
        with self.engine.begin() as conn:
            conn.execute(upsert(self.engine, records, row, list(values)))
        self.maybe_evict(now)

    def put_if(self, kind: str, id: str, body: bytes, tag: str, expected: str) -> bool:
        """Overwrite a record only while its tag is still `expected`: a compare-and-set, so of two
        replicas moving a batch on (finalizing it, say) exactly one does."""
        now = time.time()
        where = and_(records.c.kind == kind, records.c.id == id, records.c.tag == expected)
        values = {"body": body, "size": len(body), "tag": tag, "expires_at": now + self.ttl_s}
        with self.engine.begin() as conn:
            return bool(conn.execute(update(records).where(where).values(**values)).rowcount)

    def get(self, kind: str, id: str) -> bytes | None:
        query = select(records.c.body).where(
            records.c.kind == kind, records.c.id == id, alive(time.time())
        )
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    def delete(self, kind: str, id: str) -> bool:
        with self.engine.begin() as conn:
            gone = conn.execute(
                delete(records).where(records.c.kind == kind, records.c.id == id)
            ).rowcount
            if kind == "batch":
                conn.execute(delete(batch_lines).where(batch_lines.c.batch_id == id))
        return bool(gone)

    def pin(self, kind: str, id: str, pinned: bool) -> None:
        where = and_(records.c.kind == kind, records.c.id == id)
        with self.engine.begin() as conn:
            conn.execute(update(records).where(where).values(pinned=pinned))

    def newest(self, kind: str, limit: int, after: str | None = None) -> list[bytes]:
        """Bodies of `kind`, newest first; `after`: only those after that record in this order
        (records written in one clock tick are ordered by id, so a page never skips one)."""
        query = select(records.c.body).where(records.c.kind == kind, alive(time.time()))
        with self.engine.connect() as conn:
            if after is not None:
                start = conn.execute(
                    select(records.c.created_at).where(
                        records.c.kind == kind, records.c.id == after
                    )
                ).scalar()
                if start is None:
                    return []
                query = query.where(
                    or_(
                        records.c.created_at < start,
                        and_(records.c.created_at == start, records.c.id < after),
                    )
                )
            query = query.order_by(records.c.created_at.desc(), records.c.id.desc()).limit(limit)
            return list(conn.execute(query).scalars())

    def ids_tagged(self, kind: str, tags: tuple[str, ...]) -> list[str]:
        query = select(records.c.id).where(records.c.kind == kind, records.c.tag.in_(tags))
        with self.engine.connect() as conn:
            return list(conn.execute(query.order_by(records.c.created_at)).scalars())

    def total_bytes(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(func.coalesce(func.sum(records.c.size), 0))).scalar_one()
            )

    # -- bounds ---------------------------------------------------------------------------------

    def maybe_evict(self, now: float) -> None:
        if now - self._last_evict >= EVICT_EVERY_S and self._evict_lock.acquire(blocking=False):
            try:
                self._last_evict = now
                self.evict(now)
            finally:
                self._evict_lock.release()

    def evict(self, now: float | None = None) -> int:
        """Delete expired records, then the oldest unpinned ones while over max_bytes."""
        now = time.time() if now is None else now
        unpinned = records.c.pinned.is_(False)
        with self.engine.begin() as conn:
            expired = select(records.c.kind, records.c.id, records.c.size).where(
                records.c.expires_at <= now, unpinned
            )
            gone: list[tuple[str, str]] = []
            over = self._over_cap(conn)
            for kind, id, size in conn.execute(expired):
                gone.append((kind, id))
                over -= size  # deleted anyway: the cap counts what stays
            if over > 0:
                oldest = (
                    select(records.c.kind, records.c.id, records.c.size)
                    .where(records.c.expires_at > now, unpinned)
                    .order_by(records.c.created_at)
                )
                for kind, id, size in conn.execute(oldest):
                    if over <= 0:
                        break
                    gone.append((kind, id))
                    over -= size
            for kind, id in gone:
                conn.execute(delete(records).where(records.c.kind == kind, records.c.id == id))
                if kind == "batch":
                    conn.execute(delete(batch_lines).where(batch_lines.c.batch_id == id))
        return len(gone)

    def _over_cap(self, conn: Connection) -> int:
        total = conn.execute(select(func.coalesce(func.sum(records.c.size), 0))).scalar_one()
        return int(total) - self.max_bytes

    # -- batch lines ----------------------------------------------------------------------------

    def add_lines(self, batch_id: str, lines: list[tuple[int, str, str]]) -> None:
        """A batch's requests: (line number, model, request JSON), all pending."""
        rows = [
            {
                "batch_id": batch_id,
                "line": n,
                "model": model,
                "request": request,
                "state": "pending",
            }
            for n, model, request in lines
        ]
        with self.engine.begin() as conn:
            if rows:
                conn.execute(insert(batch_lines), rows)

    def beat(self, owner: str) -> None:
        """A runner is alive; its claimed lines stay its own."""
        with self.engine.begin() as conn:
            conn.execute(
                upsert(self.engine, owners, {"id": owner, "seen_at": time.time()}, ["seen_at"])
            )

    def claim(self, batch_id: str, models: set[str], owner: str, count: int) -> list[Line]:
        """Up to `count` lines of the batch for these models that are pending or held by a
        runner that is gone, now held by `owner`. Each is taken by a compare-and-set, so two
        runners never hold one line."""
        stale = select(owners.c.id).where(owners.c.seen_at < time.time() - OWNER_STALE_S)
        free = or_(
            batch_lines.c.state == "pending",
            and_(
                batch_lines.c.state == "claimed",
                or_(
                    batch_lines.c.owner.in_(stale),
                    batch_lines.c.owner.not_in(select(owners.c.id)),
                ),
            ),
        )
        query = (
            select(
                batch_lines.c.line,
                batch_lines.c.model,
                batch_lines.c.request,
                batch_lines.c.state,
                batch_lines.c.owner,
            )
            .where(batch_lines.c.batch_id == batch_id, batch_lines.c.model.in_(models), free)
            .order_by(batch_lines.c.line)
            .limit(count)
        )
        taken = []
        with self.engine.begin() as conn:
            for line, model, request, state, old_owner in list(conn.execute(query)):
                same = and_(
                    batch_lines.c.batch_id == batch_id,
                    batch_lines.c.line == line,
                    batch_lines.c.state == state,
                    batch_lines.c.owner.is_(None)
                    if old_owner is None
                    else batch_lines.c.owner == old_owner,
                )
                took = conn.execute(
                    update(batch_lines).where(same).values(state="claimed", owner=owner)
                ).rowcount
                if took:
                    taken.append(Line(batch_id, line, model, request))
        return taken

    def finish(self, batch_id: str, line: int, ok: bool, result: str) -> bool:
        """A line's one result; False if it already had one (never two lines for one)."""
        where = and_(
            batch_lines.c.batch_id == batch_id,
            batch_lines.c.line == line,
            batch_lines.c.state != "done",
        )
        with self.engine.begin() as conn:
            values = {"state": "done", "ok": ok, "result": result}
            return bool(conn.execute(update(batch_lines).where(where).values(**values)).rowcount)

    def release(self, batch_id: str, line: int, owner: str) -> None:
        """Give a claimed line back (its runner stopped before it ran)."""
        where = and_(
            batch_lines.c.batch_id == batch_id,
            batch_lines.c.line == line,
            batch_lines.c.state == "claimed",
            batch_lines.c.owner == owner,
        )
        with self.engine.begin() as conn:
            conn.execute(update(batch_lines).where(where).values(state="pending", owner=None))

    def line_counts(self, batch_id: str) -> dict[str, int]:
        """Lines by state: pending, claimed, completed (done and ok), failed (done, not ok)."""
        query = (
            select(batch_lines.c.state, batch_lines.c.ok, func.count())
            .where(batch_lines.c.batch_id == batch_id)
            .group_by(batch_lines.c.state, batch_lines.c.ok)
        )
        counts = {"pending": 0, "claimed": 0, "completed": 0, "failed": 0}
        with self.engine.connect() as conn:
            for state, ok, n in conn.execute(query):
                key = state if state != "done" else ("completed" if ok else "failed")
                counts[key] += n
        return counts

    def results(self, batch_id: str) -> Iterator[tuple[int, bool, str]]:
        """Every finished line's (line, ok, result), in line order."""
        query = (
            select(batch_lines.c.line, batch_lines.c.ok, batch_lines.c.result)
            .where(batch_lines.c.batch_id == batch_id, batch_lines.c.state == "done")
            .order_by(batch_lines.c.line)
        )
        with self.engine.connect() as conn:
            yield from conn.execute(query)

    def unfinished(self, batch_id: str) -> list[tuple[int, str]]:
        """Lines without a result: (line, request JSON)."""
        query = (
            select(batch_lines.c.line, batch_lines.c.request)
            .where(batch_lines.c.batch_id == batch_id, batch_lines.c.state != "done")
            .order_by(batch_lines.c.line)
        )
        with self.engine.connect() as conn:
            return [(line, request) for line, request in conn.execute(query)]


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def open_store(config: StateConfig) -> Store:
    """This process's store for `config` (one engine and connection pool per process)."""
    key = config.model_dump_json()
    with _stores_lock:
        if key not in _stores:
            _stores[key] = Store(config)
        return _stores[key]

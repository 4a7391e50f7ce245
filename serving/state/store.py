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
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    create_engine,
    delete,
    event,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from serving.config.access import DEFAULT_TENANT
from serving.config.state import StateConfig
from serving.models import cache_root
from serving.state.ledger import LedgerStore
from serving.state.line_store import LineStore, delete_lines_of
from serving.state.quota_store import QuotaStore
from serving.state.tables import add_missing_columns, alive, metadata, records, upsert

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
            add_missing_columns(engine)
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL: readers in other replicas' processes do not block a writer."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


class Store(LineStore, QuotaStore, LedgerStore):
    def __init__(self, config: StateConfig, engine: Engine | None = None) -> None:
        self.ttl_s = config.ttl_s
        self.max_bytes = config.max_bytes
        self.engine = engine or engine_for(config)
        create_tables(self.engine)
        self._last_evict = 0.0
        self._evict_lock = threading.Lock()

    # -- records --------------------------------------------------------------------------------

    def put(
        self, kind: str, id: str, body: bytes, tag: str | None = None, tenant: str = DEFAULT_TENANT
    ) -> bool:
        """Write `tenant`'s record (a new one or over its old one), expiring ttl_s from now. A
        record of another tenant under the same id is left as it is (False)."""
        now = time.time()
        values = {"body": body, "size": len(body), "tag": tag, "expires_at": now + self.ttl_s}
        row = {"kind": kind, "id": id, "tenant": tenant, "pinned": False, "created_at": now}
        with self.engine.begin() as conn:
            statement = upsert(self.engine, records, row | values, list(values), same="tenant")
            # RETURNING, not rowcount: PostgreSQL counts a conflict whose WHERE updated nothing
            written = conn.execute(statement.returning(records.c.id)).first() is not None
        self.maybe_evict(now)
        return written

    def owner(self, kind: str, id: str) -> str | None:
        """The tenant of a record (live or not yet evicted); None: no such record."""
        query = select(records.c.tenant).where(records.c.kind == kind, records.c.id == id)
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    def put_if(self, kind: str, id: str, body: bytes, tag: str, expected: str) -> bool:
        """Overwrite a record only while its tag is still `expected`: a compare-and-set, so of two
        replicas moving a batch on (finalizing it, say) exactly one does."""
        now = time.time()
        where = and_(records.c.kind == kind, records.c.id == id, records.c.tag == expected)
        values = {"body": body, "size": len(body), "tag": tag, "expires_at": now + self.ttl_s}
        with self.engine.begin() as conn:
            return bool(conn.execute(update(records).where(where).values(**values)).rowcount)

    def get(self, kind: str, id: str, tenant: str | None = None) -> bytes | None:
        """A live record; `tenant`: only if it is that tenant's (None: the platform, any)."""
        query = select(records.c.body).where(
            records.c.kind == kind, records.c.id == id, alive(time.time()), of_tenant(tenant)
        )
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    def delete(self, kind: str, id: str, tenant: str | None = None) -> bool:
        where = and_(records.c.kind == kind, records.c.id == id, of_tenant(tenant))
        with self.engine.begin() as conn:
            gone = conn.execute(delete(records).where(where)).rowcount
            if kind == "batch":
                conn.execute(delete_lines_of(id))
        return bool(gone)

    def pin(self, kind: str, id: str, pinned: bool) -> None:
        where = and_(records.c.kind == kind, records.c.id == id)
        with self.engine.begin() as conn:
            conn.execute(update(records).where(where).values(pinned=pinned))

    def newest(
        self, kind: str, limit: int, after: str | None = None, tenant: str | None = None
    ) -> list[bytes]:
        """Bodies of `kind` (`tenant`'s only, when given), newest first; `after`: only those after
        that record in this order (records written in one clock tick are ordered by id, so a
        page never skips one)."""
        mine = and_(records.c.kind == kind, of_tenant(tenant))
        query = select(records.c.body).where(mine, alive(time.time()))
        with self.engine.connect() as conn:
            if after is not None:
                start = conn.execute(
                    select(records.c.created_at).where(mine, records.c.id == after)
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

    def ids_tagged(self, kind: str, tags: tuple[str, ...], tenant: str | None = None) -> list[str]:
        query = select(records.c.id).where(
            records.c.kind == kind, records.c.tag.in_(tags), of_tenant(tenant)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(query.order_by(records.c.created_at)).scalars())

    def tenant_bytes(self, tenant: str) -> int:
        """Bytes of a tenant's live records (its share of max_bytes)."""
        query = select(func.coalesce(func.sum(records.c.size), 0)).where(
            records.c.tenant == tenant, alive(time.time())
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

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
        """Delete expired records, then, while over max_bytes, the oldest unpinned ones of the
        tenant that holds the most: one tenant's uploads never evict a lighter tenant's data."""
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
                    select(records.c.kind, records.c.id, records.c.size, records.c.tenant)
                    .where(records.c.expires_at > now, unpinned)
                    .order_by(records.c.created_at)
                )
                gone += heaviest_first([tuple(row) for row in conn.execute(oldest)], over)
            for kind, id in gone:
                conn.execute(delete(records).where(records.c.kind == kind, records.c.id == id))
                if kind == "batch":
                    conn.execute(delete_lines_of(id))
        return len(gone)

    def _over_cap(self, conn: Connection) -> int:
        total = conn.execute(select(func.coalesce(func.sum(records.c.size), 0))).scalar_one()
        return int(total) - self.max_bytes


def heaviest_first(oldest: list[tuple[Any, ...]], over: int) -> list[tuple[str, str]]:
    """Which records to evict to free `over` bytes: `oldest` is (kind, id, size, tenant) oldest
    first; each pick is the oldest record of the tenant holding the most bytes at that point (of
    tenants holding as much, the older record)."""
    queues: dict[str, deque[tuple[int, str, str, int]]] = defaultdict(deque)
    held: Counter[str] = Counter()
    for position, (kind, id, size, tenant) in enumerate(oldest):
        queues[tenant].append((position, kind, id, size))
        held[tenant] += size
    chosen = []
    while over > 0 and queues:
        tenant = max(queues, key=lambda name: (held[name], -queues[name][0][0]))
        _, kind, id, size = queues[tenant].popleft()
        chosen.append((kind, id))
        over -= size
        held[tenant] -= size
        if not queues[tenant]:
            del queues[tenant]
    return chosen


def of_tenant(tenant: str | None) -> Any:
    """Records of `tenant`; None: every tenant's (the platform's own reads)."""
    return true() if tenant is None else records.c.tenant == tenant


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def open_store(config: StateConfig) -> Store:
    """This process's store for `config` (one engine and connection pool per process)."""
    key = config.model_dump_json()
    with _stores_lock:
        if key not in _stores:
            _stores[key] = Store(config)
        return _stores[key]

"""The store's tables (SQLAlchemy Core, the same on SQLite and PostgreSQL): records (stored
responses, their messages, files, batches), the lines of running batches, and the runners that
hold lines."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    or_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

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

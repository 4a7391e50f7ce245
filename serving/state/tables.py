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

from serving.config.access import DEFAULT_TENANT

metadata = MetaData()
records = Table(
    "records",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("body", LargeBinary, nullable=False),
    Column("size", Integer, nullable=False),
    Column("tag", String(32), nullable=True),  # a batch's status, to find the running ones
    # Whose record it is: a request reads and changes only its tenant's (serving/state/tenancy.py).
    Column("tenant", String(64), nullable=False, server_default=DEFAULT_TENANT, index=True),
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

# Tenants' rate limits, shared by every replica: requests and tokens per tenant and minute, and
# each replica's requests in flight per tenant (refreshed while it holds any).
quota_windows = Table(
    "quota_windows",
    metadata,
    Column("tenant", String(64), primary_key=True),
    Column("minute", Integer, primary_key=True),  # epoch seconds // 60
    Column("requests", Integer, nullable=False),
    Column("tokens", Integer, nullable=False),
)
tenant_inflight = Table(
    "tenant_inflight",
    metadata,
    Column("tenant", String(64), primary_key=True),
    Column("replica", String(128), primary_key=True),
    Column("count", Integer, nullable=False),
    Column("seen_at", Float, nullable=False),
)

# The usage ledger: per day (UTC), tenant, model and adapter, what the engines served.
usage_days = Table(
    "usage_days",
    metadata,
    Column("day", String(10), primary_key=True),  # YYYY-MM-DD
    Column("tenant", String(64), primary_key=True),
    Column("model", String(256), primary_key=True),
    Column("adapter", String(256), primary_key=True),  # "" for the base model
    *(
        Column(name, Integer, nullable=False)
        for name in (
            "requests",
            "prompt_tokens",
            "cached_tokens",
            "output_tokens",
            "errors",
            "refusals",
        )
    ),
)


def upsert(
    engine: Engine,
    table: Table,
    values: dict[str, Any],
    update_keys: list[str],
    same: str | None = None,
) -> Any:
    """INSERT ... ON CONFLICT DO UPDATE: one statement, so concurrent writers of one new key
    never collide (an UPDATE-then-INSERT lets two of them INSERT). `same`: a column the stored
    row must share with the new one to be updated (a record never changes its tenant)."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).values(**values)
    keys = [column.name for column in table.primary_key]
    if not update_keys:  # insert if absent
        return statement.on_conflict_do_nothing(index_elements=keys)
    where = None if same is None else table.c[same] == statement.excluded[same]
    return statement.on_conflict_do_update(
        index_elements=keys, set_={key: statement.excluded[key] for key in update_keys}, where=where
    )


def upsert_adding(engine: Engine, table: Table, values: dict[str, Any], counts: list[str]) -> Any:
    """INSERT ... ON CONFLICT DO UPDATE that adds `counts` to the stored row's."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).values(**values)
    keys = [column.name for column in table.primary_key]
    added = {name: table.c[name] + statement.excluded[name] for name in counts}
    return statement.on_conflict_do_update(index_elements=keys, set_=added)


def add_missing_columns(engine: Engine) -> None:
    """Columns added since a store's tables were created (create_all adds tables, not columns):
    `records.tenant`, every older record the default tenant's."""
    from sqlalchemy import inspect, text

    present = {column["name"] for column in inspect(engine).get_columns("records")}
    if "tenant" not in present:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "ALTER TABLE records ADD COLUMN tenant VARCHAR(64) NOT NULL "
                    f"DEFAULT '{DEFAULT_TENANT}'"
                )
            )


def alive(now: float) -> ColumnElement[bool]:
    """Not expired, or pinned (a running batch's records outlive their TTL until unpinned)."""
    return or_(records.c.expires_at > now, records.c.pinned.is_(True))

"""The usage ledger: per day (UTC), tenant, model and adapter, the requests the engines served,
their prompt, cached prompt and output tokens, the engine requests that failed and the requests
refused by a tenant's limits. A replica adds what it served to its own tally and writes the tally
to the store every FLUSH_S (one upsert per row, adding), so the request path never waits on it;
`llm-serving usage` and the admin route read the sums."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from collections import Counter
from typing import Any

from sqlalchemy import Engine, select

from serving.state.tables import upsert_adding, usage_days

FLUSH_S = 2.0
COUNTS = ("requests", "prompt_tokens", "cached_tokens", "output_tokens", "errors", "refusals")
Row = tuple[str, str, str, str]  # day, tenant, model, adapter


def day_of(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d")


class LedgerStore:
    """Ledger rows, for the Store that mixes this in (its `engine`)."""

    engine: Engine

    def add_usage(self, tally: dict[Row, Counter[str]]) -> None:
        with self.engine.begin() as conn:
            for (day, tenant, model, adapter), counts in tally.items():
                row: dict[str, Any] = {"day": day, "tenant": tenant, "model": model}
                row["adapter"] = adapter
                row |= {name: counts.get(name, 0) for name in COUNTS}
                conn.execute(upsert_adding(self.engine, usage_days, row, list(COUNTS)))

    def usage(self, tenant: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """Ledger rows, oldest day first; `tenant` and `since` (a day, inclusive) filter."""
        query = select(usage_days)
        if tenant is not None:
            query = query.where(usage_days.c.tenant == tenant)
        if since is not None:
            query = query.where(usage_days.c.day >= since)
        order = (usage_days.c.day, usage_days.c.tenant, usage_days.c.model, usage_days.c.adapter)
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query.order_by(*order))]


class Tally:
    """A replica's usage since its last flush to the store."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.rows: dict[Row, Counter[str]] = {}
        self.lock = threading.Lock()

    def add(self, row: Row, **counts: int) -> None:
        with self.lock:
            self.rows.setdefault(row, Counter()).update(counts)

    def flush(self) -> None:
        with self.lock:
            rows, self.rows = self.rows, {}
        if not rows:
            return
        try:
            self.store.add_usage(rows)
        except Exception:  # the store is down: keep the counts for the next flush
            with self.lock:
                for row, counts in rows.items():
                    self.rows.setdefault(row, Counter()).update(counts)
            raise

    async def flush_every(self, seconds: float = FLUSH_S) -> None:
        while True:
            await asyncio.sleep(seconds)
            with contextlib.suppress(Exception):  # logged by the store's driver; retried next
                await asyncio.to_thread(self.flush)

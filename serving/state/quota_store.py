"""Tenants' rate-limit counters in the store, so a limit holds across every replica of every
model: requests and tokens per tenant in fixed one-minute windows, and requests in flight per
tenant as each replica reports them (a replica that stops reporting is left out after
INFLIGHT_STALE_S). Each call is one short transaction; none is made for a tenant without limits."""

from __future__ import annotations

import time

from sqlalchemy import Connection, Engine, and_, delete, func, select, true, update

from serving.state.tables import quota_windows, tenant_inflight, upsert

INFLIGHT_STALE_S = 30.0  # a replica refreshes its rows every INFLIGHT_REFRESH_S while it holds any
INFLIGHT_REFRESH_S = 5.0
WINDOW_S = 60


def minute(now: float) -> int:
    return int(now // WINDOW_S)


class QuotaStore:
    """Rate-limit counters, for the Store that mixes this in (its `engine`)."""

    engine: Engine

    def take_request(self, tenant: str, now: float, limit: int | None) -> int | None:
        """Count one request in `tenant`'s current minute unless it already has `limit` (None:
        no limit): the minute's count with it, or None when refused. A compare-and-set, so two
        replicas never both take the last one."""
        window = and_(quota_windows.c.tenant == tenant, quota_windows.c.minute == minute(now))
        under = true() if limit is None else quota_windows.c.requests < limit
        with self.engine.begin() as conn:
            self._open_window(conn, tenant, now)
            taken = conn.execute(
                update(quota_windows)
                .where(window, under)
                .values(requests=quota_windows.c.requests + 1)
                .returning(quota_windows.c.requests)
            ).first()
        return None if taken is None else int(taken[0])

    def add_tokens(self, tenant: str, now: float, tokens: int) -> None:
        window = and_(quota_windows.c.tenant == tenant, quota_windows.c.minute == minute(now))
        with self.engine.begin() as conn:
            self._open_window(conn, tenant, now)
            conn.execute(
                update(quota_windows).where(window).values(tokens=quota_windows.c.tokens + tokens)
            )

    def window_counts(self, tenant: str, now: float) -> tuple[int, int]:
        """(requests, tokens) of `tenant`'s current minute."""
        query = select(quota_windows.c.requests, quota_windows.c.tokens).where(
            quota_windows.c.tenant == tenant, quota_windows.c.minute == minute(now)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def _open_window(self, conn: Connection, tenant: str, now: float) -> None:
        row = {"tenant": tenant, "minute": minute(now), "requests": 0, "tokens": 0}
        conn.execute(upsert(self.engine, quota_windows, row, []))
        # Windows before the last one are never read again.
        conn.execute(
            delete(quota_windows).where(
                quota_windows.c.tenant == tenant, quota_windows.c.minute < minute(now) - 1
            )
        )

    def report_inflight(self, tenant: str, replica: str, count: int) -> None:
        row = {"tenant": tenant, "replica": replica, "count": count, "seen_at": time.time()}
        with self.engine.begin() as conn:
            conn.execute(upsert(self.engine, tenant_inflight, row, ["count", "seen_at"]))

    def inflight_elsewhere(self, tenant: str, replica: str) -> int:
        """`tenant`'s requests in flight on the other replicas that reported lately."""
        query = select(func.coalesce(func.sum(tenant_inflight.c.count), 0)).where(
            tenant_inflight.c.tenant == tenant,
            tenant_inflight.c.replica != replica,
            tenant_inflight.c.seen_at > time.time() - INFLIGHT_STALE_S,
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

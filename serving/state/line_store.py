"""The lines of a batch in the store: queued when the batch is created, claimed by runners (a
compare-and-set each, so two runners never hold one line; a runner that stops beating loses its
lines), each given one result, and deleted when the batch has ended (its output and error files
hold the results then)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Delete, Engine, and_, delete, func, insert, or_, select, update

from serving.state.tables import batch_lines, owners, upsert

OWNER_STALE_S = 15.0  # a runner that has not beaten for this long is gone: its lines go back


def delete_lines_of(batch_id: str) -> Delete:
    """The statement that deletes a batch's lines (when it ends, or with its record)."""
    return delete(batch_lines).where(batch_lines.c.batch_id == batch_id)


@dataclass(frozen=True)
class Line:
    batch_id: str
    line: int
    model: str
    request: str


class LineStore:
    """Batch lines, for the Store that mixes this in (its `engine`)."""

    engine: Engine

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

    def delete_lines(self, batch_id: str) -> None:
        """An ended batch's lines: its output and error files hold their results now."""
        with self.engine.begin() as conn:
            conn.execute(delete_lines_of(batch_id))

    def unfinished(self, batch_id: str) -> list[tuple[int, str]]:
        """Lines without a result: (line, request JSON)."""
        query = (
            select(batch_lines.c.line, batch_lines.c.request)
            .where(batch_lines.c.batch_id == batch_id, batch_lines.c.state != "done")
            .order_by(batch_lines.c.line)
        )
        with self.engine.connect() as conn:
            return [(line, request) for line, request in conn.execute(query)]

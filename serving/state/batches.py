"""Files and batches of the OpenAI Batch API in the platform's store: `/v1/files` records and
`/v1/batches` records (the batch's status is the record's tag, so running ones are found), its
lines in the store's batch lines. Objects are OpenAI's own types (`openai.types`). Every call
blocks (store I/O): async callers run them in a thread.

A batch moves validating -> in_progress -> finalizing -> completed | expired, or failed (its
input file cannot run at all), or cancelling -> cancelled; each move out of a running status is
a compare-and-set on the tag, so of several replicas exactly one makes it."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from openai.types import Batch, FileDeleted, FileObject

from serving.config.state import BatchSettings, StateConfig
from serving.state.batch_lines import (
    ENDPOINTS,
    NO_MODEL,
    LineError,
    ParsedFile,
    custom_id_of,
    dump,
    error_line,
    fatal_error,
    new_id,
    parse_input,
)
from serving.state.store import Store, open_store
from serving.state.tenancy import owner_tenant, request_settings, request_tenant

RUNNING = ("validating", "in_progress", "cancelling", "finalizing")
ENDED = ("completed", "failed", "expired", "cancelled")
MAX_WINDOW_S = 24 * 3600
WINDOW = re.compile(r"^([1-9][0-9]*)([hm])$")
FILE, CONTENT, BATCH = "file", "file_content", "batch"


class BatchAPIError(ValueError):
    """A request the Batch API refuses (the HTTP layer answers it in OpenAI's error shape)."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


def window_seconds(window: str) -> int:
    """A completion window in seconds. OpenAI accepts only "24h"; the platform also takes a
    shorter "<n>h" or "<n>m" (a batch that must finish sooner), up to 24 hours."""
    match = WINDOW.match(window)
    seconds = int(match.group(1)) * (3600 if match.group(2) == "h" else 60) if match else 0
    if not 0 < seconds <= MAX_WINDOW_S:
        raise BatchAPIError(
            f"completion_window {window!r}: give '24h' or a shorter '<n>h' / '<n>m'",
            param="completion_window",
        )
    return seconds


def updated(batch: Batch, fields: dict[str, Any]) -> Batch:
    """`batch` with new field values, validated (nested objects become OpenAI's types)."""
    return Batch.model_validate({**batch.model_dump(), **fields})


def not_found(what: str, id: str) -> BatchAPIError:
    return BatchAPIError(f"No {what} with id {id!r}", status=404, param="id")


def check_storage_room(store: Store, size: int) -> None:
    """A request whose tenant would hold more than its max_stored_bytes with `size` more bytes is
    refused (429): a tenant's writes never make room by evicting another tenant's records."""
    settings = request_settings()
    limit = settings.max_stored_bytes if settings else None
    if limit is None or settings is None:
        return
    held = store.tenant_bytes(settings.name)
    if held + size > limit:
        raise BatchAPIError(
            f"tenant {settings.name} stores {held} bytes; {size} more would pass its limit "
            f"auth.tenants[].max_stored_bytes={limit}: delete files or responses first",
            status=429,
            code="storage_quota_exceeded",
        )


class Batches:
    def __init__(self, store: Store, settings: BatchSettings) -> None:
        self.store = store
        self.settings = settings

    # -- files ----------------------------------------------------------------------------------

    def create_file(self, filename: str, purpose: str, content: bytes) -> FileObject:
        check_storage_room(self.store, len(content))
        file = FileObject(
            id=new_id("file"),
            bytes=len(content),
            created_at=int(time.time()),
            filename=filename,
            object="file",
            purpose=purpose,  # checked by the HTTP layer (only "batch")
            status="processed",
        )
        tenant = owner_tenant()
        self.store.put(CONTENT, file.id, content, tenant=tenant)
        self.store.put(FILE, file.id, file.model_dump_json().encode(), tenant=tenant)
        return file

    def file(self, id: str) -> FileObject:
        body = self.store.get(FILE, id, request_tenant())
        if body is None:
            raise not_found("file", id)
        return FileObject.model_validate_json(body)

    def files(self, limit: int, after: str | None, purpose: str | None) -> list[FileObject]:
        count = limit if purpose is None else 10_000
        bodies = self.store.newest(FILE, count, after, request_tenant())
        found = [FileObject.model_validate_json(body) for body in bodies]
        return [f for f in found if purpose is None or f.purpose == purpose][:limit]

    def file_content(self, id: str) -> bytes:
        self.file(id)
        content = self.store.get(CONTENT, id, request_tenant())
        if content is None:
            raise not_found("file content", id)
        return content

    def delete_file(self, id: str) -> FileDeleted:
        self.file(id)
        self.store.delete(CONTENT, id, request_tenant())
        self.store.delete(FILE, id, request_tenant())
        return FileDeleted(id=id, object="file", deleted=True)

    # -- batches --------------------------------------------------------------------------------

    def save(self, batch: Batch) -> None:
        """Write a batch, its tenant's: the creating request's, or the stored batch's owner (the
        platform's own updates keep it)."""
        tenant = self.store.owner(BATCH, batch.id) or owner_tenant()
        body = batch.model_dump_json().encode()
        self.store.put(BATCH, batch.id, body, tag=batch.status, tenant=tenant)

    def move(self, batch: Batch, expected: str) -> bool:
        """Save `batch` (its new status) if its stored status is still `expected`."""
        body = batch.model_dump_json().encode()
        return self.store.put_if(BATCH, batch.id, body, batch.status, expected)

    def stored(self, id: str) -> Batch:
        body = self.store.get(BATCH, id, request_tenant())
        if body is None:
            raise not_found("batch", id)
        return Batch.model_validate_json(body)

    def batch(self, id: str) -> Batch:
        """A batch as the client sees it: a running one with its live request counts."""
        batch = self.stored(id)
        return self.with_counts(batch) if batch.status in RUNNING else batch

    def batches(self, limit: int, after: str | None) -> list[Batch]:
        bodies = self.store.newest(BATCH, limit, after, request_tenant())
        return [Batch.model_validate_json(body) for body in bodies]

    def check_batch_room(self) -> None:
        """A tenant at its max_running_batches gets a 429 for another batch."""
        settings = request_settings()
        limit = settings.max_running_batches if settings else None
        if limit is None or settings is None:
            return
        running = len(self.store.ids_tagged(BATCH, RUNNING, settings.name))
        if running >= limit:
            raise BatchAPIError(
                f"tenant {settings.name} runs {running} batches, its limit "
                f"auth.tenants[].max_running_batches={limit}; retry when one ends",
                status=429,
                code="batch_quota_exceeded",
            )

    def with_counts(self, batch: Batch) -> Batch:
        counts = self.store.line_counts(batch.id)
        total = batch.request_counts.total if batch.request_counts else sum(counts.values())
        request_counts = {"total": total, "completed": counts["completed"]}
        request_counts["failed"] = counts["failed"]
        return updated(batch, {"request_counts": request_counts})

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        models: set[str],
        default_model: str,
        embedding_models: set[str] | None = None,
    ) -> Batch:
        """Validate a batch's input file and queue its lines. `embedding_models`: the models that
        can answer /v1/embeddings (None: unknown here, the replicas answer per line)."""
        if endpoint not in ENDPOINTS:
            raise BatchAPIError(
                f"endpoint {endpoint!r}: one of {', '.join(ENDPOINTS)}", param="endpoint"
            )
        if endpoint == "/v1/embeddings" and embedding_models is not None:
            models = models & embedding_models
            if not models:
                raise BatchAPIError(
                    "endpoint /v1/embeddings: no model served here makes embeddings "
                    "(serve an embedding model, e.g. with vLLM's runner: pooling)",
                    param="endpoint",
                )
        window_s = window_seconds(completion_window)
        file = self.file(input_file_id)
        self.check_batch_room()
        if file.purpose != "batch":
            raise BatchAPIError(
                f"file {input_file_id} has purpose {file.purpose!r}, not 'batch'",
                param="input_file_id",
            )
        now = int(time.time())
        batch = Batch(
            id=new_id("batch"),
            object="batch",
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status="validating",
            created_at=now,
            expires_at=now + window_s,
            metadata=metadata,
        )
        self.save(batch)
        self.store.pin(BATCH, batch.id, True)  # from here to its end, eviction leaves it
        content = self.file_content(input_file_id)
        parsed = parse_input(content, endpoint, models, default_model, self.settings.max_lines)
        return self.queue(batch, parsed)

    def queue(self, batch: Batch, parsed: ParsedFile) -> Batch:
        """A validated batch in progress (its lines in the store), or failed with its errors;
        as it is now if it was cancelled meanwhile (the runners end it)."""
        now = int(time.time())
        if parsed.fatal:
            failed = updated(
                batch,
                {
                    "status": "failed",
                    "failed_at": now,
                    "errors": {"object": "list", "data": parsed.fatal},
                    "request_counts": {"total": 0, "completed": 0, "failed": 0},
                },
            )
            if not self.move(failed, "validating"):
                return self.batch(batch.id)
            self.store.pin(BATCH, batch.id, False)
            return failed
        self.store.pin(FILE, batch.input_file_id, True)
        self.store.pin(CONTENT, batch.input_file_id, True)
        rows = parsed.runnable + [
            (n, NO_MODEL, json.dumps({"custom_id": cid})) for n, cid, _ in parsed.invalid
        ]
        self.store.add_lines(batch.id, sorted(rows))
        for n, custom_id, error in parsed.invalid:
            self.store.finish(batch.id, n, False, dump(error_line(custom_id, error)))
        counts = {"total": parsed.total, "completed": 0, "failed": len(parsed.invalid)}
        running = updated(
            batch, {"status": "in_progress", "in_progress_at": now, "request_counts": counts}
        )
        if not self.move(running, "validating"):
            return self.batch(batch.id)
        return running

    def cancel(self, id: str) -> Batch:
        """Stop a batch: no new line starts; the runners end it (cancelled) once its lines in
        flight are done. An ended batch stays as it is (OpenAI answers it unchanged)."""
        for _ in range(3):  # a runner may move it on between the read and the swap
            batch = self.stored(id)
            if batch.status not in ("validating", "in_progress"):
                return self.batch(id)
            cancelling = updated(batch, {"status": "cancelling", "cancelling_at": int(time.time())})
            if self.move(cancelling, batch.status):
                return self.with_counts(cancelling)
        return self.batch(id)

    # -- ending (the runners call these) --------------------------------------------------------

    def expire_lines(self, batch: Batch) -> None:
        """Every line not run yet becomes an error line: the completion window has passed."""
        error = LineError(
            "batch_expired", "the batch's completion window ended before this line ran"
        )
        for line, request in self.store.unfinished(batch.id):
            self.store.finish(batch.id, line, False, dump(error_line(custom_id_of(request), error)))

    def write_results(self, batch: Batch) -> dict[str, Any]:
        """The output and error files of the lines done, in line order (their ids follow the
        batch's, so a runner that redoes this after another died writes the same files)."""
        output: list[str] = []
        errors: list[str] = []
        for _, ok, result in self.store.results(batch.id):
            (output if ok else errors).append(result)
        stem = batch.id.removeprefix("batch_")
        ids = {}
        for key, lines, suffix in (
            ("output_file_id", output, "output"),
            ("error_file_id", errors, "error"),
        ):
            ids[key] = (
                self.put_result_file(
                    batch, f"file-{stem}-{suffix}", f"{batch.id}_{suffix}.jsonl", lines
                )
                if lines
                else None
            )
        total = batch.request_counts.total if batch.request_counts else len(output) + len(errors)
        counts = {"total": total, "completed": len(output), "failed": len(errors)}
        return {**ids, "request_counts": counts}

    def put_result_file(self, batch: Batch, id: str, filename: str, lines: list[str]) -> str:
        """An output or error file of `batch`, its tenant's."""
        content = "".join(line + "\n" for line in lines).encode()
        file = FileObject(
            id=id,
            bytes=len(content),
            created_at=int(time.time()),
            filename=filename,
            object="file",
            purpose="batch_output",
            status="processed",
        )
        tenant = self.store.owner(BATCH, batch.id) or owner_tenant()
        self.store.put(CONTENT, id, content, tenant=tenant)
        self.store.put(FILE, id, file.model_dump_json().encode(), tenant=tenant)
        return id

    def end(self, batch: Batch, status: str, expected: str) -> bool:
        """Write the batch's files and move it to its last status; unpin what it held."""
        at = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}
        update = {**self.write_results(batch), "status": status, at[status]: int(time.time())}
        if not self.move(updated(batch, update), expected):
            return False
        self.unpin(batch)
        self.store.delete_lines(batch.id)  # the files hold the results; the move was the last read
        return True

    def unpin(self, batch: Batch) -> None:
        for kind, id in (
            (BATCH, batch.id),
            (FILE, batch.input_file_id),
            (CONTENT, batch.input_file_id),
        ):
            self.store.pin(kind, id, False)

    def abandon(self, batch: Batch) -> bool:
        """Fail a batch whose validation never ended (the replica validating it stopped)."""
        error = fatal_error(
            "validation_interrupted",
            "the batch's validation stopped before it ended (its replica stopped): create it again",
        )
        errors = {"object": "list", "data": [error]}
        failed = updated(
            batch, {"status": "failed", "failed_at": int(time.time()), "errors": errors}
        )
        if not self.move(failed, "validating"):
            return False
        self.unpin(batch)
        return True

    def finalize(self, batch: Batch, expired: bool = False) -> bool:
        """End an in-progress batch whose lines are all done (or whose window passed): one
        runner wins the move to finalizing and writes the files."""
        finalizing = updated(batch, {"status": "finalizing", "finalizing_at": int(time.time())})
        if expired:
            finalizing = updated(finalizing, {"expired_at": int(time.time())})
        if not self.move(finalizing, "in_progress"):
            return False
        return self.finish_finalizing(finalizing)

    def finish_finalizing(self, batch: Batch) -> bool:
        """The second half of finalize, which another runner redoes if the first one died."""
        if batch.expired_at is not None:
            self.expire_lines(batch)
            return self.end(batch, "expired", "finalizing")
        return self.end(batch, "completed", "finalizing")


def open_batches(config: StateConfig) -> Batches:
    """The Batch API over this process's store."""
    return Batches(open_store(config), config.batch)

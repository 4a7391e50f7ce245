"""The OpenAI Batch API's routes (`/v1/files`, `/v1/batches`) over the platform's store, served
in front of vLLM's app by every vLLM replica and by the model router (the lines run in the
replicas' batch runners, serving/state/batch_runner.py). `call_json` runs one batch line through
the replica's own app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.api.auth import route_path
from serving.api.dispatch import run_asgi
from serving.api.errors import APIError, error_response, install_error_handlers
from serving.api.limits import BodySizeLimit
from serving.state.batch_lines import new_id
from serving.state.batches import BatchAPIError, Batches

PATHS = ("/v1/files", "/v1/batches")
MULTIPART_SLACK = 64 * 1024  # a multipart body's headers and boundaries around the file
# The served names, the default model, the models that make embeddings (None: not known here).
Served = Callable[[], tuple[set[str], str, set[str] | None]]


Key = Annotated[str, StringConstraints(max_length=64)]
Value = Annotated[str, StringConstraints(max_length=512)]


class CreateBatch(BaseModel):
    """`POST /v1/batches` (OpenAI's BatchCreateParams)."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str = Field(
        description="'24h' (OpenAI's only value) or a shorter '<n>h' / '<n>m' window."
    )
    metadata: dict[Key, Value] | None = Field(None, max_length=16)  # OpenAI's Metadata bounds


def listing(items: list[Any], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: `limit` items of `items` (one more was fetched to see if more are)."""
    page = items[:limit]
    return {
        "object": "list",
        "data": [item.model_dump(mode="json") for item in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(items) > limit,
    }


def file_too_large(size: int, limit: int) -> APIError:
    return APIError(
        f"the file has {size} bytes; the limit is state.batch.max_file_bytes={limit}",
        status=413,
        param="file",
        code="file_too_large",
    )


def batch_app(batches: Batches, served: Served) -> ASGIApp:
    """The routes, limited to a body of one largest file (413 above it, before it is read)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    limit = batches.settings.max_file_bytes

    @app.exception_handler(BatchAPIError)
    async def _refused(_: Request, err: BatchAPIError) -> JSONResponse:
        kind = "NotFoundError" if err.status == 404 else None
        return error_response(APIError(err.message, err.status, err.param, err.code, kind=kind))

    @app.post("/v1/files")
    async def create_file(
        file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
    ) -> JSONResponse:
        if purpose != "batch":
            raise APIError(f"purpose {purpose!r}: only 'batch' is served", param="purpose")
        content = await file.read(limit + 1)
        if len(content) > limit:
            raise file_too_large(file.size or len(content), limit)
        name = file.filename or "input.jsonl"
        created = await asyncio.to_thread(batches.create_file, name, purpose, content)
        return JSONResponse(created.model_dump(mode="json"))

    @app.get("/v1/files")
    async def list_files(
        limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
        after: str | None = None,
        purpose: str | None = None,
    ) -> dict[str, Any]:
        found = await asyncio.to_thread(batches.files, limit + 1, after, purpose)
        return listing(found, limit)

    @app.get("/v1/files/{id}")
    async def get_file(id: str) -> dict[str, Any]:
        return (await asyncio.to_thread(batches.file, id)).model_dump(mode="json")

    @app.get("/v1/files/{id}/content")
    async def get_content(id: str) -> Response:
        content = await asyncio.to_thread(batches.file_content, id)
        return Response(content, media_type="application/octet-stream")

    @app.delete("/v1/files/{id}")
    async def delete_file(id: str) -> dict[str, Any]:
        return (await asyncio.to_thread(batches.delete_file, id)).model_dump(mode="json")

    @app.post("/v1/batches")
    async def create_batch(request: CreateBatch) -> dict[str, Any]:
        models, default, embedding = served()
        batch = await asyncio.to_thread(
            batches.create_batch,
            request.input_file_id,
            request.endpoint,
            request.completion_window,
            request.metadata,
            models,
            default,
            embedding,
        )
        return batch.model_dump(mode="json")

    @app.get("/v1/batches")
    async def list_batches(
        limit: Annotated[int, Query(ge=1, le=100)] = 20, after: str | None = None
    ) -> dict[str, Any]:
        return listing(await asyncio.to_thread(batches.batches, limit + 1, after), limit)

    @app.get("/v1/batches/{id}")
    async def get_batch(id: str) -> dict[str, Any]:
        return (await asyncio.to_thread(batches.batch, id)).model_dump(mode="json")

    @app.post("/v1/batches/{id}/cancel")
    async def cancel_batch(id: str) -> dict[str, Any]:
        return (await asyncio.to_thread(batches.cancel, id)).model_dump(mode="json")

    return FileBodyLimit(app, limit)


class FileBodyLimit(BodySizeLimit):
    """The routes' body limit: one largest file and its multipart framing. A body over it is
    refused before it is read, naming the file limit (not limits.max_body_bytes)."""

    def __init__(self, app: ASGIApp, max_file_bytes: int) -> None:
        super().__init__(app, max_file_bytes + MULTIPART_SLACK)
        self.max_file_bytes = max_file_bytes

    def too_large(self) -> APIError:
        return APIError(
            f"the upload is over the file limit state.batch.max_file_bytes={self.max_file_bytes}",
            status=413,
            param="file",
            code="file_too_large",
        )


class BatchRoutes:
    """ASGI: `/v1/files*` and `/v1/batches*` go to the Batch API's app, the rest to `app`."""

    def __init__(self, batch: ASGIApp, app: ASGIApp) -> None:
        self.batch = batch
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope).startswith(PATHS):
            await self.batch(scope, receive, send)
            return
        await self.app(scope, receive, send)


def line_scope(url: str) -> dict[str, Any]:
    """The HTTP scope of one batch line as if a client on loopback had sent it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "server": ("127.0.0.1", 0),
        "client": ("127.0.0.1", 0),
    }


async def call_json(app: ASGIApp, url: str, body: dict[str, Any]) -> tuple[int, Any, str]:
    """Run one JSON request through `app`: (status, JSON body, request id)."""
    status, chunks = 500, []
    async for messages in run_asgi(app, line_scope(url), json.dumps(body).encode()):
        for message in messages:
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
    raw = b"".join(chunks)
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = {"error": {"message": raw.decode(errors="replace"), "type": "server_error"}}
    request_id = payload.get("id") if isinstance(payload, dict) else None
    return status, payload, str(request_id or new_id("req"))

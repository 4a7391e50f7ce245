"""vLLM's Responses API with its store in the platform's store (serving/state/store.py), so
`store: true`, `previous_response_id`, retrieval, deletion and background mode work whichever
replica answers, and after a restart. vLLM's serving layer still builds every response: its two
dicts (`response_store`, `msg_store`) become views over the store, and only where vLLM changes a
stored object in place (a background run that fails, a cancel) is the change written back.

vLLM reads and writes those dicts synchronously, inside its `async with response_store_lock`:
a SQLite read is well under a millisecond, a PostgreSQL one a round trip on the cluster network,
both short beside the generation they serve. The code here runs its own calls in a thread.

A background run is watched on the replica that runs it: a cancel written by another replica
(or a deletion) cancels its task there, which aborts the engine request; its heartbeat lets any
replica mark a run whose replica stopped (a restart mid-run) as failed instead of in progress."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic_core
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from serving.state.store import Store
from serving.state.tenancy import owner_tenant, request_settings, request_tenant

if TYPE_CHECKING:
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

RESPONSE = "response"  # a ResponsesResponse, as vLLM returns it
MESSAGES = "response_messages"  # the conversation a follow-up continues (vLLM's msg_store)
RUN = "response_run"  # a background run's heartbeat: {"owner": replica, "beat_at": time}
RUNNING = ("queued", "in_progress")
WATCH_EVERY_S = 0.5  # how soon a run sees a cancel written on another replica
BEAT_EVERY_S = 5.0
RUN_LOST_S = 30.0  # a running response whose run has not beaten this long lost its replica

V = TypeVar("V")


class StoreView(MutableMapping[str, V]):
    """One kind of the store's records as the dict vLLM keeps (get, set, delete by id)."""

    def __init__(
        self,
        store: Store,
        kind: str,
        encode: Callable[[V], bytes],
        decode: Callable[[bytes], V],
    ) -> None:
        self.store = store
        self.kind = kind
        self.encode = encode
        self.decode = decode

    def __getitem__(self, id: str) -> V:
        body = self.store.get(self.kind, id, request_tenant())
        if body is None:
            raise KeyError(id)
        return self.decode(body)

    def __setitem__(self, id: str, value: V) -> None:
        self.store.put(self.kind, id, self.encode(value), tenant=owner_tenant())

    def __delitem__(self, id: str) -> None:
        if not self.store.delete(self.kind, id, request_tenant()):
            raise KeyError(id)

    def __iter__(self) -> Iterator[str]:
        raise TypeError(f"the shared store's {self.kind} records are looked up by id, not listed")

    def __len__(self) -> int:
        raise TypeError(f"the shared store's {self.kind} records are looked up by id, not counted")


def response_view(store: Store) -> StoreView[ResponsesResponse]:
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    return StoreView(
        store,
        RESPONSE,
        lambda response: response.model_dump_json().encode(),
        ResponsesResponse.model_validate_json,
    )


def messages_view(store: Store, harmony: bool) -> StoreView[list[Any]]:
    """vLLM's `ResponsesPreviousMessages`: chat messages (plain dicts) or, for gpt-oss, Harmony
    messages. A pydantic TypeAdapter of that union drops message fields and Harmony contents,
    so each kind is written as its own JSON."""
    return StoreView(store, MESSAGES, encode_messages, harmony_messages if harmony else json.loads)


def encode_messages(messages: list[Any]) -> bytes:
    return pydantic_core.to_json(
        [m.to_dict() if hasattr(m, "to_dict") else m for m in messages], fallback=list
    )


def harmony_messages(body: bytes) -> list[Any]:
    from openai_harmony import Message

    return [Message.from_dict(message) for message in json.loads(body)]


def keep_responses(app: FastAPI, store: Store, replica: str = "", max_background: int = 8) -> None:
    """Plug `store` under vLLM's Responses serving object of `app` (its app state), with the
    store on whatever VLLM_ENABLE_RESPONSES_API_STORE says, and add the DELETE route; at most
    `max_background` background runs at once."""
    serving = app.state.openai_serving_responses
    if serving is None:  # a model without the Responses API (e.g. an embedding model)
        return
    serving.enable_store = True
    kept = KeptResponses(serving, store, replica, response_view(store), max_background)
    serving.response_store = kept.responses
    serving.msg_store = messages_view(store, serving.use_harmony)
    # Instance attributes over vLLM's methods: each wraps (or falls back to) vLLM's own.
    for name, method in (
        ("create_responses", kept.create),
        ("_run_background_request", kept.run_watched),
        ("_run_background_request_stream", kept.run_watched),
        ("cancel_responses", kept.cancel),
        ("retrieve_responses", kept.retrieve),
    ):
        setattr(serving, name, functools.partial(method, getattr(serving, name)))
    app.add_api_route(
        "/v1/responses/{response_id}", kept.delete_route, methods=["DELETE"], tags=["responses"]
    )


class KeptResponses:
    """What vLLM's serving object does differently with its responses in the shared store."""

    def __init__(
        self,
        serving: OpenAIServingResponses,
        store: Store,
        replica: str,
        responses: StoreView[ResponsesResponse],
        max_background: int = 8,
    ) -> None:
        self.serving = serving
        self.store = store
        self.replica = replica  # whose runs these are (a run's heartbeat names it)
        self.responses = responses  # what vLLM reads as its response_store
        self.max_background = max_background

    async def create(self, create: Callable[..., Any], request: Any, *args: Any, **kw: Any) -> Any:
        """vLLM's create, but a background request over the replica's cap is a 429: a background
        run outlives its HTTP request, so nothing else bounds how many run at once."""
        from http import HTTPStatus

        chosen: set[str] = getattr(request, "model_fields_set", set())
        if "request_id" in chosen and await asyncio.to_thread(self.taken, request.request_id):
            return self.serving.create_error_response(
                f"a response with id {request.request_id!r} exists: a client-chosen request_id "
                "must be new (it becomes the stored response's id)",
                err_type="invalid_request_error",
                status_code=HTTPStatus.CONFLICT,
                param="request_id",
            )
        if refusal := await self.storage_refusal(request):
            return refusal
        running = len(self.serving.background_tasks)
        if getattr(request, "background", False) and running >= self.max_background:
            return self.serving.create_error_response(
                f"this replica runs {running} background responses, the limit "
                f"state.max_background_responses={self.max_background}; retry when one ends",
                err_type="rate_limit_exceeded",
                status_code=HTTPStatus.TOO_MANY_REQUESTS,
                param="background",
            )
        return await create(request, *args, **kw)

    async def storage_refusal(self, request: Any) -> Any:
        """A response to store from a tenant already at its max_stored_bytes: a 429 before it is
        generated (its size is known only after)."""
        from http import HTTPStatus

        settings = request_settings()
        limit = settings.max_stored_bytes if settings else None
        if settings is None or limit is None or not getattr(request, "store", True):
            return None
        held = await asyncio.to_thread(self.store.tenant_bytes, settings.name)
        if held < limit:
            return None
        return self.serving.create_error_response(
            f"tenant {settings.name} stores {held} bytes, its limit auth.tenants[]."
            f"max_stored_bytes={limit}: delete responses or files, or send store: false",
            err_type="storage_quota_exceeded",
            status_code=HTTPStatus.TOO_MANY_REQUESTS,
            param="store",
        )

    def taken(self, response_id: str) -> bool:
        """Whether any tenant's response (or its messages) has this id."""
        return any(self.store.owner(kind, response_id) for kind in (RESPONSE, MESSAGES))

    # -- background runs -------------------------------------------------------------------------

    async def run_watched(
        self, run: Callable[..., Any], request: Any, *args: Any, **kw: Any
    ) -> None:
        """vLLM's background run, watched for a cancel from any replica; a run that ends with its
        response still running in the store failed (vLLM marks the copy it read)."""
        response_id = request.request_id
        current = asyncio.current_task()
        assert current is not None  # vLLM runs it as a task of its own
        watcher = asyncio.create_task(self.watch(response_id, current))
        failure = "the response's run ended without a result"
        try:
            await run(request, *args, **kw)
        except Exception as err:  # a generation error: the response failed, the replica did not
            failure = f"{type(err).__name__}: {err}"
        finally:
            watcher.cancel()
            await asyncio.to_thread(self.store.delete, RUN, response_id, request_tenant())
        await self.mark_failed(response_id, failure)

    async def watch(self, response_id: str, run: asyncio.Task) -> None:
        """Beat for the run and cancel it once its stored response is cancelled or deleted."""
        beat_at = 0.0
        while True:
            if time.monotonic() - beat_at >= BEAT_EVERY_S:
                beat_at = time.monotonic()
                await asyncio.to_thread(self.beat, response_id)
            stored = await asyncio.to_thread(self.responses.get, response_id)
            if stored is None or stored.status == "cancelled":
                run.cancel()  # vLLM's generate aborts the engine request
                return
            await asyncio.sleep(WATCH_EVERY_S)

    def beat(self, response_id: str) -> None:
        record = {"owner": self.replica, "beat_at": time.time()}
        self.store.put(RUN, response_id, json.dumps(record).encode(), tenant=owner_tenant())

    async def mark_failed(self, response_id: str, message: str) -> None:
        """A response still queued or in progress becomes failed, with OpenAI's `error`."""
        async with self.serving.response_store_lock:
            stored = await asyncio.to_thread(self.responses.get, response_id)
            if stored is None or stored.status not in RUNNING:
                return
            stored.status = "failed"
            error = {"code": "server_error", "message": message}
            stored.error = error  # type: ignore[attr-defined]  # an extra field: vLLM's model has none, OpenAI's Response has it
            await asyncio.to_thread(self.responses.__setitem__, response_id, stored)

    def run_lost(self, response: ResponsesResponse, now: float) -> bool:
        """Its run's last beat (none yet: its creation) is older than RUN_LOST_S."""
        body = self.store.get(RUN, response.id, request_tenant())
        beat_at = json.loads(body)["beat_at"] if body is not None else response.created_at
        return now - beat_at > RUN_LOST_S

    async def fail_if_lost(self, response_id: str) -> None:
        """A running response that no replica runs any more (its replica stopped) failed."""
        stored = await asyncio.to_thread(self.responses.get, response_id)
        if stored is None or stored.status not in RUNNING:
            return
        if response_id in self.serving.background_tasks:
            return
        if await asyncio.to_thread(self.run_lost, stored, time.time()):
            await self.mark_failed(response_id, "the replica running this response stopped")

    # -- the routes ------------------------------------------------------------------------------

    async def cancel(self, vllm_cancel: Callable[..., Any], response_id: str) -> Any:
        """vLLM's cancel, with "cancelled" written to the store (where the replica that runs the
        response sees it); vLLM's own errors for an unknown or finished response."""
        async with self.serving.response_store_lock:
            response = await asyncio.to_thread(self.responses.get, response_id)
            if response is not None and response.status in RUNNING:
                response.status = "cancelled"
                await asyncio.to_thread(self.responses.__setitem__, response_id, response)
            else:
                response = None
        if response is None:
            return await vllm_cancel(response_id)
        if task := self.serving.background_tasks.get(response_id):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return response

    async def retrieve(
        self,
        vllm_retrieve: Callable[..., Any],
        response_id: str,
        starting_after: int | None,
        stream: bool | None,
    ) -> Any:
        """vLLM's retrieval, after failing a run whose replica stopped. Streaming a background
        response replays vLLM's events, which only the replica that runs it holds: elsewhere
        a 400 that says so (vLLM would fail the stream)."""
        await self.fail_if_lost(response_id)
        elsewhere = stream and response_id not in self.serving.event_store
        if elsewhere and await asyncio.to_thread(self.responses.get, response_id) is not None:
            return self.serving.create_error_response(
                f"response {response_id} can be streamed only from the replica that runs it "
                "in background streaming mode: retrieve it without `stream` instead",
                err_type="invalid_request_error",
                param="stream",
            )
        return await vllm_retrieve(response_id, starting_after=starting_after, stream=stream)

    def forget(self, response_id: str) -> bool:
        """Delete a stored response and its messages (a run of it elsewhere sees it gone)."""
        tenant = request_tenant()
        self.store.delete(MESSAGES, response_id, tenant)
        self.store.delete(RUN, response_id, tenant)
        return self.store.delete(RESPONSE, response_id, tenant)

    async def delete_route(self, response_id: str) -> JSONResponse:
        """`DELETE /v1/responses/{id}` (vLLM has none), answered as OpenAI does."""
        if not await asyncio.to_thread(self.forget, response_id):
            error = self.serving._make_not_found_error(response_id)
            return JSONResponse(error.model_dump(mode="json"), status_code=error.error.code)
        if task := self.serving.background_tasks.get(response_id):
            task.cancel()
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

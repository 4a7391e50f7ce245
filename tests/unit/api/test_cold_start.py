"""Scale to zero around the model router, without Ray: the held wait's limit (serving.api.cold_start
over a stand-in for Serve's streaming response), the refusals' OpenAI shape, and a model at zero
listed and reported as cold without being asked. The real path: tests/integration/test_cold_start.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from ray.serve.exceptions import BackPressureError

from serving.api import cold_start
from serving.api.dispatch import COLD_HEALTH, ModelDispatch
from serving.api.errors import APIError
from serving.api.model_routes import Route, model_routes
from tests.unit.api.test_dispatch import client, dispatch


class Response:
    """Serve's DeploymentResponseGenerator as `held` uses it: an assignment, then the stream."""

    def __init__(self, assigned_after_s: float, error: Exception | None = None) -> None:
        self.assigned_after_s = assigned_after_s
        self.error = error
        self.cancelled = False

    async def _fetch_future_result_async(self) -> None:
        await asyncio.sleep(self.assigned_after_s)
        if self.error:
            raise self.error

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> Any:
        async def items() -> Any:
            for item in ("a", "b"):
                yield item

        return items()


async def drain(response: Response, wait_s: float | None) -> list[str]:
    return [item async for item in cold_start.held(response, wait_s)]


def test_a_request_taken_within_the_wait_streams_through() -> None:
    assert asyncio.run(drain(Response(0.01), wait_s=5)) == ["a", "b"]
    assert asyncio.run(drain(Response(0.01), wait_s=None)) == ["a", "b"]


def test_a_request_not_taken_within_the_wait_is_taken_out_of_the_queue() -> None:
    response = Response(assigned_after_s=60)
    with pytest.raises(cold_start.QueueWaitExceeded) as raised:
        asyncio.run(drain(response, wait_s=0.05))
    assert response.cancelled and raised.value.wait_s == 0.05


def test_a_full_queue_raises_serves_backpressure_error() -> None:
    full = BackPressureError(num_queued_requests=4, max_queued_requests=4)
    with pytest.raises(BackPressureError):
        asyncio.run(drain(Response(0, error=full), wait_s=5))


def test_refusals_name_the_bound_and_carry_retry_after_in_whole_seconds() -> None:
    full = BackPressureError(num_queued_requests=4, max_queued_requests=4)
    error = cold_start.refusal("m", 503, 1.5, full)
    assert (error.status, error.code, error.headers) == (503, "queue_full", {"Retry-After": "2"})
    waited = cold_start.refusal("m", 429, 2, cold_start.QueueWaitExceeded(300))
    assert (waited.status, waited.code, waited.headers) == (
        429,
        "queue_wait_exceeded",
        {"Retry-After": "2"},
    )
    assert "300 s" in waited.message and "model m" in waited.message


def cold_dispatch(cold: set[str]) -> tuple[ModelDispatch, list[Route]]:
    """The stand-in dispatch with `cold` models at zero; what it forwarded."""
    forwarded: list[Route] = []
    inner = dispatch(forwarded)

    async def cold_models() -> set[str]:
        return cold

    def refusal(route: Route, err: Exception) -> APIError | None:
        return None

    app = ModelDispatch(
        model_routes({"base": ["base-lora"], "other": []}),
        "base",
        inner.forward,
        refusal,
        inner.adapter_cards,
        cold_models=cold_models,
        cold_card=lambda name: {"id": name, "object": "model", "max_model_len": 1024},
    )
    return app, forwarded


def test_a_model_at_zero_is_listed_as_cold_and_not_asked() -> None:
    app, forwarded = cold_dispatch({"other"})

    async def go() -> httpx.Response:
        async with client(app) as http:
            return await http.get("/v1/models")

    cards = {card["id"]: card for card in asyncio.run(go()).json()["data"]}
    assert cards["other"] == {"id": "other", "object": "model", "max_model_len": 1024, "cold": True}
    assert cards["base"]["cold"] is False and "cold" not in cards["base-lora"]
    assert forwarded == [Route("base")]


def test_a_model_at_zero_is_healthy_and_cold_without_being_asked() -> None:
    app, forwarded = cold_dispatch({"other"})

    async def go() -> httpx.Response:
        async with client(app) as http:
            return await http.get("/health")

    response = asyncio.run(go())
    assert response.status_code == 200
    assert response.json()["models"]["other"] == COLD_HEALTH
    assert forwarded == [Route("base")]

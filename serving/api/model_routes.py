"""Where a request's `model` name goes on a multi-model endpoint: its base model's deployment, and
the adapter when it names one. Shared by the dispatcher and the run-time adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    """Where a `model` name goes: its base model's deployment; `adapter` when it names one."""

    model: str
    adapter: str | None = None


def model_routes(models: Mapping[str, list[str]]) -> dict[str, Route]:
    """Every name a request may ask for: each model, and each adapter of it."""
    routes = {name: Route(name) for name in models}
    for name, adapters in models.items():
        routes |= {adapter: Route(name, adapter) for adapter in adapters}
    return routes

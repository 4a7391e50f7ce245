"""LoRA adapters added and removed while the platform runs, on the one endpoint of a multi-model
platform: vLLM's own routes and bodies (`POST /v1/load_lora_adapter` {lora_name, lora_path},
`POST /v1/unload_lora_adapter` {lora_name}), plus an optional `model` naming the base model when
several models allow it. Only models with `runtime_adapters: true` take them, and only with API
keys on (the router refuses to start without). A path must lie under the model's adapter_roots
or be one of its adapter_hub_ids: each replica checks it before loading (serving/config/adapters.py). A
load is checked by loading the adapter into one replica before the name is served; other
replicas load it when a request for it reaches them, as for configured adapters. vLLM's own
routes are not registered on the replicas (no VLLM_ALLOW_RUNTIME_LORA_UPDATING), so these checks
cannot be bypassed; `load_inplace` (replacing a served adapter's weights) is refused."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from serving.api.errors import APIError
from serving.api.model_routes import Route

# Loads an adapter (its route, its path) into one replica of its base model; raises on refusal.
Preload = Callable[[Route, str], Awaitable[None]]

# An adapter's name is a `model` name and Serve's multiplexed model id: as configured names.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def bad_input(message: str, status: int = 400) -> APIError:
    return APIError(message, status=status, kind="NotFoundError" if status == 404 else None)


class RuntimeAdapters:
    """The adapters added at run time: their routes (shared with the dispatcher's), paths and
    model cards."""

    def __init__(
        self,
        routes: dict[str, Route],
        allowed: list[str],
        preload: Preload,
        hub_ids: dict[str, list[str]] | None = None,
    ) -> None:
        self.routes = routes  # the dispatcher's own dict: a loaded name is served at once
        self.allowed = allowed  # models with runtime_adapters
        self.preload = preload
        self.hub_ids = hub_ids or {}  # each model's adapter_hub_ids: cards may show these
        self.paths: dict[str, str] = {}
        self.cards: list[dict[str, Any]] = []
        # Unloaded names: replicas may still hold their weights (Serve's multiplexing keeps an
        # adapter until it is evicted), so a new load under one would serve the old weights.
        self.retired: set[str] = set()

    def base_model(self, data: dict[str, Any]) -> str:
        model = data.get("model")
        if model is None and len(self.allowed) == 1:
            return self.allowed[0]
        if model is None:
            raise bad_input(f"name the base model in `model` (one of {', '.join(self.allowed)})")
        if model not in self.allowed:
            raise bad_input(
                f"model {model!r} does not take adapters at run time (set "
                f"runtime_adapters on it); these do: {', '.join(self.allowed) or 'none'}"
            )
        return str(model)

    async def load(self, data: dict[str, Any]) -> str:
        name, path = data.get("lora_name"), data.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise bad_input("Both 'lora_name' and 'lora_path' must be provided.")
        if data.get("load_inplace", False) is not False:
            raise bad_input(
                "load_inplace is refused: a served adapter's weights are not replaced at run "
                "time; unload it and load the new one under another name."
            )
        if not ADAPTER_NAME.match(name):
            raise bad_input(
                f"lora_name {name!r} must start with a letter or digit and hold only letters, "
                "digits, '.', '_' and '-'."
            )
        model = self.base_model(data)
        if name in self.retired:
            raise bad_input(
                f"The lora adapter '{name}' was unloaded earlier and replicas may still hold its "
                "weights: load the new one under another name."
            )
        if name in self.routes:
            raise bad_input(
                f"The lora adapter '{name}' has already been loaded (or names a model)."
            )
        route = Route(model, name)
        try:
            await self.preload(route, path)
        except Exception as err:  # vLLM's refusal, carried back through the handle
            raise bad_input(
                f"The lora adapter '{name}' could not be loaded: {reason(err)}"
            ) from None
        self.routes[name] = route
        self.paths[name] = path
        # The card names a hub id, never a server path.
        root = path if path in self.hub_ids.get(model, []) else name
        self.cards.append(adapter_card(name, model, root))
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, data: dict[str, Any]) -> str:
        name = data.get("lora_name")
        if not isinstance(name, str) or not name:
            raise bad_input("'lora_name' needs to be provided to unload a LoRA adapter.")
        if name not in self.paths:
            if name in self.routes:
                raise bad_input(
                    f"The lora adapter '{name}' is in the platform config; remove it there."
                )
            raise bad_input(f"The lora adapter '{name}' cannot be found.", status=404)
        del self.routes[name], self.paths[name]
        self.retired.add(name)
        self.cards = [card for card in self.cards if card["id"] != name]
        return f"Success: LoRA adapter '{name}' removed successfully."


def reason(err: Exception) -> str:
    """The last line of a refusal (a RayTaskError repeats the replica's traceback)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def adapter_card(name: str, parent: str, root: str | None = None) -> dict[str, Any]:
    """vLLM's model card of an adapter (id, parent: its base model). vLLM's `root` is the path
    it loaded: here the name or a hub id, so no card shows a server path."""
    from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelPermission

    card = ModelCard(id=name, root=root or name, parent=parent, permission=[ModelPermission()])
    return card.model_dump(mode="json")

"""LoRA adapters loaded into one replica's engine when a request names them (behind the model
router): Serve's model multiplexing (`serve.multiplexed`) keeps at most `max_adapters` per
replica, least recently used first out, and tells every handle which replica holds which adapter
so requests go where their adapter already is. vLLM's own loader registers each one (as its
`/v1/load_lora_adapter` route does); vLLM's engine keeps the same number in memory, also LRU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ray import serve


class AdapterLoadError(RuntimeError):
    """vLLM refused an adapter (missing path, wrong base model, rank over max_lora_rank)."""


class ReplicaAdapters:
    """The adapters of one replica; `load(name)` before a request that names one."""

    def __init__(
        self,
        serving_models: Any,
        paths: dict[str, str],
        capacity: int,
        on_load: Callable[[str], None],
    ) -> None:
        self.serving_models = serving_models  # vLLM's OpenAIServingModels of the replica's app
        self.paths = paths
        self.on_load = on_load
        self.loads: Counter[str] = Counter()

        async def load(name: str) -> str:  # a function: Serve keeps its LRU state on it
            return await self._load(name)

        self._loader = load
        self.load = serve.multiplexed(max_num_models_per_replica=capacity)(load)

    async def _load(self, name: str) -> str:
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        # load_inplace: vLLM may still list it from an earlier load that Serve has evicted.
        request = LoadLoRAAdapterRequest(
            lora_name=name, lora_path=self.paths[name], load_inplace=True
        )
        result = await self.serving_models.load_lora_adapter(request)
        if not isinstance(result, str):  # vLLM's ErrorResponse
            raise AdapterLoadError(f"adapter {name}: {result.error.message}")
        self.loads[name] += 1
        self.on_load(name)
        return name

    def held(self) -> list[str]:
        """Adapters this replica holds now (Serve's multiplexed model ids)."""
        wrapper = getattr(self._loader, "__serve_multiplex_wrapper", None)
        return list(wrapper.models) if wrapper is not None else []

"""A replica's on-demand adapters, around vLLM's own loader (a stand-in here; the real engine
loads them in tests/integration/multi_model/test_multi_model.py): each load is counted and reported, and a
refusal names the adapter."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serving.engines.vllm_lora import AdapterLoadError, ReplicaAdapters


class ServingModels:
    """vLLM's OpenAIServingModels' loader: a message on success, an ErrorResponse otherwise."""

    def __init__(self) -> None:
        self.requests = []

    async def load_lora_adapter(self, request):
        self.requests.append(request)
        if request.lora_path == "/missing":
            return SimpleNamespace(error=SimpleNamespace(message="No adapter found at /missing"))
        return f"Success: LoRA adapter '{request.lora_name}' added successfully."


def test_a_load_goes_through_vllms_loader_and_is_counted() -> None:
    models, loaded = ServingModels(), []
    adapters = ReplicaAdapters(models, {"a": "/adapters/a"}, 2, loaded.append)
    assert asyncio.run(adapters._load("a")) == "a"
    assert asyncio.run(adapters._load("a")) == "a"
    assert [(r.lora_name, r.lora_path, r.load_inplace) for r in models.requests] == [
        ("a", "/adapters/a", True)
    ] * 2
    assert adapters.loads["a"] == 2 and loaded == ["a", "a"]
    assert adapters.held() == []  # nothing through Serve's multiplexing yet


def test_a_refused_adapter_is_an_error_naming_it() -> None:
    adapters = ReplicaAdapters(ServingModels(), {"b": "/missing"}, 2, lambda name: None)
    with pytest.raises(AdapterLoadError, match="adapter b: No adapter found at /missing"):
        asyncio.run(adapters._load("b"))
    assert adapters.loads["b"] == 0

"""Model references: local directories, hub ids (offline -> one clear error), built-in models."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving import models
from serving.models import ModelNotFoundError, resolve_model


def test_local_directory_with_config_resolves(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_corrupt_safetensors_is_rejected_before_any_engine_loads_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 4096)
    with pytest.raises(ModelNotFoundError, match="model.safetensors is not a readable safetensors"):
        resolve_model(str(tmp_path))


def test_missing_path_is_rejected() -> None:
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        resolve_model("/nonexistent/model")


def test_offline_hub_id_gives_one_line_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("some-org/model-that-is-not-cached")
    message = str(info.value)
    assert "\n" not in message
    assert "some-org/model-that-is-not-cached" in message and "'default'" in message


def test_embedded_gguf_ships_in_its_package() -> None:
    path = models.embedded_gguf_path()
    assert path.name == models.EMBEDDED_GGUF and path.stat().st_size > 50_000_000


def test_tiny_qwen2_keeps_qwen25_gqa_ratio_and_tied_embeddings() -> None:
    config = models.tiny_qwen2_config(vocab_size=1000, bos_token_id=1, eos_token_id=2)
    assert config.num_attention_heads // config.num_key_value_heads == 7  # as Qwen2.5: 14 / 2
    assert config.head_dim >= 32  # vLLM's CPU attention rejects smaller heads
    assert config.tie_word_embeddings is True
    assert config.model_type == "qwen2"


def test_cache_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLM_SERVING_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    assert models.cache_root(str(tmp_path / "x")) == tmp_path / "x"

"""LoRA adapters of a served model: where each one's weights are, and demo adapters built locally.

An adapter's `path` is a local directory (as `peft` saves one), a Hugging Face id, or `demo:NAME`:
a random-initialised LoRA adapter for the model, built with `peft` into the cache the first time a
replica (or `llm-serving adapters demo`) asks for it, the way the embedded default model is built.
Demo adapters need no network and change the model's output, so tests and the multi-model example
can check that a request reached its adapter."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from serving.models import cache_root

DEMO_PREFIX = "demo:"
DEMO_RANK = 8
DEMO_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def demo_seed(name: str) -> int:
    """A stable seed per adapter name: the same name builds the same weights on every machine."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def demo_adapter_dir(model_dir: Path, name: str, cache_dir: str | None = None) -> Path:
    return cache_root(cache_dir) / "adapters" / model_dir.name / name


def build_demo_adapter(model_dir: Path, out_dir: Path, seed: int) -> None:
    """Save a random-initialised LoRA adapter (rank 8 on the attention projections) for the model
    in `model_dir`. peft's default init leaves B at zero (a no-op adapter); random B changes the
    output, which is the point of a demo."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=DEMO_RANK,
        lora_alpha=2 * DEMO_RANK,
        target_modules=list(DEMO_TARGETS),
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(base, config).save_pretrained(str(out_dir))


def ensure_demo_adapter(model_dir: Path, name: str, cache_dir: str | None = None) -> Path:
    """The directory of demo adapter `name` for the model, built once (a file lock keeps two
    replicas from building it together)."""
    target = demo_adapter_dir(model_dir, name, cache_dir)
    if (target / "adapter_config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "adapter_config.json").is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            build_demo_adapter(model_dir, staging, demo_seed(name))
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_adapter_path(path: str, model_dir: Path, cache_dir: str | None = None) -> str:
    """What vLLM loads for an adapter's `path`: demo adapters are built here, a local path is
    expanded, anything else (a Hugging Face id) is vLLM's to fetch."""
    if path.startswith(DEMO_PREFIX):
        return str(ensure_demo_adapter(model_dir, path.removeprefix(DEMO_PREFIX), cache_dir))
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path


class AdapterPathRefused(ValueError):
    """A runtime adapter's path outside the model's adapter_roots and adapter_hub_ids."""


def allowed_adapter_path(path: str, roots: list[str], hub_ids: list[str]) -> str:
    """What vLLM may load for a runtime adapter's `lora_path`: a configured Hugging Face id (when
    no such local path exists: vLLM would load a local one first), or a local path whose real
    path (links resolved, as vLLM will open it) lies under one of the real `roots`."""
    if path in hub_ids and not os.path.lexists(path):
        return path
    real = os.path.realpath(os.path.expanduser(path))
    for root in roots:
        base = os.path.realpath(os.path.expanduser(root))
        if os.path.commonpath([base, real]) == base:
            return real
    raise AdapterPathRefused(
        f"lora_path {path!r} is not under the model's adapter_roots "
        f"({', '.join(roots) or 'none'}) nor one of its adapter_hub_ids "
        f"({', '.join(hub_ids) or 'none'})"
    )

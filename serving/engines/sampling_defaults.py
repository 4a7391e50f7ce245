"""A model's own sampling defaults (generation_config.json), as vLLM applies them: a request that
leaves a field out gets the model creator's value."""

from __future__ import annotations

import logging
from typing import Any

# Sampling fields a model's generation_config.json may set, as vLLM reads them (its
# `--generation-config auto`, the default of `vllm serve`): they replace the neutral defaults of
# a request that leaves them out. `max_new_tokens` is not taken: max_tokens has its own default.
MODEL_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def model_sampling_defaults(model_dir: Any) -> dict[str, float]:
    """The sampling values the model's generation_config.json sets away from transformers'
    defaults (the same diff vLLM takes); {} when the model has none."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json
        return {}
    diff = config.to_diff_dict()
    values = {key: diff[key] for key in MODEL_SAMPLING_FIELDS if diff.get(key) is not None}
    if values:  # as vLLM says it: a request that omits these gets the model creator's values
        logging.getLogger(__name__).info("default sampling from generation_config: %s", values)
    return values

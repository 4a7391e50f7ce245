"""`python -m serving.engines.vllm_start`: one engine started as a replica starts it, outside Ray,
its start-up phases printed as JSON (docs/benchmarks/autoscaling.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from serving.config import ConfigError, load_config
from serving.engines.vllm import VLLMEngine
from serving.engines.vllm_startup import startup_phases
from serving.models import ModelNotFoundError, resolve_model


def main() -> None:
    """`python -m serving.engines.vllm_start [--config FILE] [--model REF]`: start one engine
    the way a replica does, outside Ray, and print its start-up phases as JSON."""
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--config", help="platform config YAML (default: the built-in defaults)")
    parser.add_argument("--model", help="model reference overriding the config's")
    options = parser.parse_args()

    try:
        config = load_config(options.config)
        if options.model:
            config = config.model_copy(
                update={"model": config.model.model_copy(update={"ref": options.model})}
            )
        model_dir = resolve_model(config.model.ref, config.model.cache_dir)
    except (ConfigError, ModelNotFoundError) as err:
        sys.exit(f"error: {err}")

    async def start_and_stop() -> dict[str, float]:
        # inside a running loop, as in a replica: the in-process engine core needs one
        engine = VLLMEngine.start(config, model_dir)
        try:
            return {**engine.startup_timings, **startup_phases(engine.startup_at)}
        finally:
            engine.shutdown()

    timings = asyncio.run(start_and_stop())
    print(json.dumps({**timings, "total": round(time.perf_counter() - started, 2)}))


if __name__ == "__main__":
    main()

"""What every engine replica shares (no deployment here): the Ray actor options its resources
ask for, Serve's health check delegated to the engine, and the engine stopped with the replica."""

from __future__ import annotations

from typing import Any

from serving.config.replica import ReplicaResources


def replica_actor_options(resources: ReplicaResources, env: dict[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": resources.num_cpus}
    if resources.accelerator == "gpu":
        options["num_gpus"] = 1
    if resources.custom_resources:
        options["resources"] = dict(resources.custom_resources)
    if env:
        options["runtime_env"] = {"env_vars": env}
    return options


class EngineReplica:
    """Base of a deployment that owns one engine in `self.engine`."""

    engine: Any

    async def check_health(self) -> None:
        """Serve's replica health check: a dead engine (or generation thread) gets the replica
        replaced."""
        await self.engine.check_health()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()

"""A toy fourth app, as a contributor would add one: its deployment module (this file) and one
registry entry (tests/k8s/test_app_registry.py adds it to serving.apps.APPS)."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from ray import serve
from ray.serve import Application

from serving.config import PlatformConfig
from serving.replica_config import StrictModel


class EchoConfig(StrictModel):
    """The app's section of the platform config: on/off, route and its one deployment option."""

    enabled: bool = True
    route_prefix: str = "/echo"
    max_ongoing_requests: int = Field(4, gt=0)


class EchoPlatform(PlatformConfig):
    """PlatformConfig with the app's section, as the field a real app adds to it."""

    echo: EchoConfig = Field(default_factory=EchoConfig)


@serve.deployment(name="Echo")
class Echo:
    def __init__(self, model: str) -> None:
        self.model = model

    async def __call__(self, request: Any) -> dict[str, str]:
        return {"model": self.model}


def echo_app(args: dict[str, Any]) -> Application:
    config = EchoPlatform.model_validate(args)
    return Echo.bind(config.model.name)  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment

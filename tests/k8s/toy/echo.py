"""A toy fourth app, as a contributor would add one: its deployment module (this file) and its
registry entry, the App-annotated field of the platform config (here on a subclass, so the real
PlatformConfig stays as it is; a real app adds the field to PlatformConfig itself)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from ray import serve
from ray.serve import Application

from serving.config import PlatformConfig
from serving.config.apps import App
from serving.config.replica import StrictModel


class EchoConfig(StrictModel):
    """The app's section of the platform config: on/off, route and its one deployment option."""

    enabled: bool = True
    route_prefix: str = "/echo"
    max_ongoing_requests: int = Field(4, gt=0)


class EchoPlatform(PlatformConfig):
    """PlatformConfig with the app's registry entry."""

    echo: Annotated[EchoConfig, App("tests.k8s.toy.echo:echo_app", "Echo", scaled=False)] = Field(
        default_factory=EchoConfig, description="The echo application."
    )


@serve.deployment(name="Echo")
class Echo:
    def __init__(self, model: str) -> None:
        self.model = model

    async def __call__(self, request: Any) -> dict[str, str]:
        return {"model": self.model}


def echo_app(args: dict[str, Any]) -> Application:
    config = EchoPlatform.model_validate(args)
    return Echo.bind(config.model.name)  # type: ignore[attr-defined]  # @serve.deployment makes it a Deployment

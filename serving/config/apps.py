"""The platform's Serve apps. The registry is PlatformConfig itself: each app is one field,
annotated with its App entry (`Annotated[Section, App(builder, deployment)]`), whose section
enables, routes and sizes it. `apps_of(config)` reads the entries in field order; local runs, the
RayService's serve config (serving.k8s.serve_config), the chart's app table (generated into
helm/llm-serving/templates/_generated.tpl) and the operator (which renders the chart) all read it.

Adding an app: its field (the entry) and its deployment module, with its Serve builder, which
takes the app's part of the platform config as `args` (tests/k8s/test_app_registry.py adds a toy
one)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel


@dataclass(frozen=True)
class App:
    builder: str  # import path of its Serve application builder ("module:function")
    deployment: str  # the name of its one deployment
    # Whether Serve scales it: replicas or autoscaling, backpressure, graceful shutdown. An app
    # that is not scaled gets only max_ongoing_requests.
    scaled: bool = True
    name: str = ""  # the Serve app's name: its PlatformConfig field (apps_of fills it in)
    state: bool = False  # whether it reads the platform's store (PlatformConfig.state)
    traced: bool = False  # whether it reads PlatformConfig.tracing (its spans, or reads them)

    @property
    def sections(self) -> tuple[str, ...]:
        """PlatformConfig parts in its args. Serve hashes args into the app's code version and
        restarts every replica when they change, so an app gets only its own part."""
        optional = (("state", self.state), ("tracing", self.traced))
        return ("model", self.name, "auth", "limits") + tuple(k for k, on in optional if on)


# With `models`, the `vllm` app is this router at vllm.route_prefix, and each model an app of its
# own built by MODEL_BUILDER, without a route (the router reaches it by handle).
ROUTER_BUILDER = "serving.deployments.model_router:router_app"
ROUTER_DEPLOYMENT = "ModelRouter"
MODEL_BUILDER = "serving.deployments.vllm_server:model_app"


def apps_of(config: BaseModel | type[BaseModel]) -> tuple[App, ...]:
    """The apps of a platform config (or its class): its App-annotated fields, in field order."""
    fields = (config if isinstance(config, type) else type(config)).model_fields
    return tuple(
        replace(entry, name=name)
        for name, info in fields.items()
        for entry in info.metadata
        if isinstance(entry, App)
    )


def app_named(config: BaseModel | type[BaseModel], name: str) -> App:
    return next(app for app in apps_of(config) if app.name == name)

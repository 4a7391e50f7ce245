"""The platform's Serve apps, one entry each: the one list that local runs, the RayService's serve
config (serving.k8s.serve_config), the chart's app table (generated into
helm/llm-serving/templates/_generated.tpl) and the operator (which renders the chart) all read.

Adding an app: an entry here and its deployment module (with its Serve builder, which takes the
app's part of the platform config as `args`), and the PlatformConfig section its entry names,
which enables, routes and sizes it (tests/k8s/test_app_registry.py adds a toy one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class App:
    name: str  # the Serve app's name, and the PlatformConfig section it is configured by
    builder: str  # import path of its Serve application builder ("module:function")
    deployment: str  # the name of its one deployment
    # Whether Serve scales it: replicas or autoscaling, backpressure, graceful shutdown. An app
    # that is not scaled gets only max_ongoing_requests.
    scaled: bool = True

    @property
    def sections(self) -> tuple[str, ...]:
        """PlatformConfig parts in its args. Serve hashes args into the app's code version and
        restarts every replica when they change, so an app gets only its own part."""
        return ("model", self.name, "auth", "limits")


APPS: tuple[App, ...] = (
    App("vllm", "serving.deployments.vllm_server:vllm_app", "VLLMServer"),
    App("hf", "serving.deployments.hf_baseline:hf_app", "HFBaseline"),
    App("analysis", "serving.deployments.analysis:analysis_app", "Analysis", scaled=False),
)
# With `models`, the `vllm` app is this router at vllm.route_prefix, and each model an app of its
# own built by MODEL_BUILDER, without a route (the router reaches it by handle).
ROUTER_BUILDER = "serving.deployments.model_router:router_app"
MODEL_BUILDER = "serving.deployments.vllm_server:model_app"


def app_named(name: str) -> App:
    """The registry entry of an app (read from APPS at each call, so a test may extend it)."""
    return next(app for app in APPS if app.name == name)

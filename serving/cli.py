"""The `llm-serving` command: up, down, status. Errors are one line and a non-zero exit."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from serving.analysis.cli import analyze
from serving.config import ConfigError, ModelConfig, PlatformConfig, load_config
from serving.conformance.cli import conformance
from serving.k8s.cli import render
from serving.loadgen.cli import bench
from serving.local.ray_access import token_path
from serving.models import ModelNotFoundError, resolve_model
from serving.state.cli import usage
from serving.tracing import backend
from serving.tracing.cli import trace

EXIT_USAGE = 2


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Known failures print `error: ...` and exit non-zero instead of a traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from serving.local.platform import PlatformError

        try:
            return func(*args, **kwargs)
        except ConfigError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(EXIT_USAGE)
        except (ModelNotFoundError, PlatformError, backend.BackendError) as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)

    return wrapper


def models_to_prepare(config: PlatformConfig) -> list[ModelConfig]:
    """Models `up` resolves (builds or downloads) before any replica starts: each served model,
    and the one the baseline and analysis apps serve."""
    served = [entry.model for entry in config.models]
    apps_on = config.hf.enabled or config.analysis.enabled or not config.models
    return served + ([config.model] if apps_on else [])


def check_servable(config: PlatformConfig) -> None:
    """What the replicas or the model router would refuse when they start, checked before Ray
    starts (a refusal there costs minutes and is printed under Ray's logs): vLLM's own parser on
    the engine options, and the API keys runtime adapters need (from the same environment)."""
    from serving.api.auth import check_runtime_adapter_keys, key_ring

    check_runtime_adapter_keys(config, key_ring(config.auth))
    if config.vllm.enabled:
        from serving.engines.vllm_args import check_server_args

        check_server_args(config)


def apply_overrides(config: PlatformConfig, model: str | None, port: int | None) -> PlatformConfig:
    """The config with `--model`/`--port`. Only what the file set stays set: Serve hashes each
    app's args into its code version, so `up` and a later `apply` of the same file must write
    the same args, or the apply restarts every app."""
    data = config.model_dump(exclude_unset=True)
    if model:
        data["model"] = {**data.get("model", {}), "ref": model}
        data["model"].pop("served_name", None)  # named after the new model
    if port:
        data["http"] = {**data.get("http", {}), "port": port}
    return PlatformConfig.model_validate(data)


def print_ready(ep: Any, traces_url: str | None = None) -> None:
    curl_body = json.dumps(
        {
            "model": ep.model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 32,
            "temperature": 0,
        }
    )
    click.echo("llm-serving is up")
    click.echo(f"  model          {ep.model}")
    if ep.served and len(ep.served) > 1:
        click.echo(f"  all models     {', '.join(ep.served)}")
    click.echo(f"  OpenAI API     {ep.api_url}")
    if ep.hf_url:
        click.echo(f"  HF baseline    {ep.hf_url}")
    if ep.analysis_url:
        click.echo(f"  analysis       {ep.analysis_url}")
    click.echo(f"  health         {ep.health_url}")
    click.echo(f"  Ray dashboard  {ep.dashboard_url}  (Ray token: {token_path()})")
    click.echo(f"  metrics        {ep.metrics_url}")
    if traces_url:
        click.echo(f"  traces         {traces_url}  (Phoenix; `llm-serving trace ID`)")
    click.echo("try:")
    click.echo(
        f"  curl -s {ep.api_url}/chat/completions -H 'Content-Type: application/json' -d '{curl_body}'"
    )


@click.group()
def main() -> None:
    """llm-serving: Ray Serve + vLLM with an OpenAI-compatible API."""


@main.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Platform config YAML."
)
@click.option("--model", help="Model reference: HF id, local dir, 'default' or 'tiny-qwen2'.")
@click.option("--port", type=int, help="HTTP port of the API.")
@click.option("--detach", is_flag=True, help="Return once every app is healthy; stop with `down`.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for every app to deploy and answer its health check.",
)
@click.option(
    "--tracing",
    is_flag=True,
    help="Start Phoenix (a trace backend with a UI, `make install-tracing`) on loopback and send "
    "every request's spans there; `down` stops it.",
)
@click.option(
    "--tracing-port",
    default=backend.DEFAULT_PORT,
    show_default=True,
    help="Phoenix's port: UI, span API and OTLP/HTTP.",
)
@click.option(
    "--tracing-grpc-port",
    default=backend.DEFAULT_GRPC_PORT,
    show_default=True,
    help="Phoenix's OTLP/gRPC.",
)
@one_line_errors
def up(
    config_path: str | None,
    model: str | None,
    port: int | None,
    detach: bool,
    timeout: float,
    tracing: bool,
    tracing_port: int,
    tracing_grpc_port: int,
) -> None:
    """Start a local Ray head, deploy every app, print the URLs."""
    from serving.local import platform as local

    config = apply_overrides(load_config(config_path), model, port)
    check_servable(config)
    if tracing:
        backend.require_phoenix()  # before minutes of model preparation
    for model_config in models_to_prepare(config):
        click.echo(f"preparing model '{model_config.ref}' ...")
        resolve_model(model_config.ref, model_config.cache_dir)
    traces_url, started_tracing = None, False
    if tracing:
        config, traces_url, started_tracing = start_tracing(config, tracing_port, tracing_grpc_port)
    click.echo("starting Ray and Serve ...")
    try:
        local.start_ray_head(config)
    except BaseException:
        if started_tracing:  # a reused Phoenix belongs to the platform already running
            backend.stop_local()
        raise
    started = time.monotonic()
    try:
        local.connect()
        deadline = time.monotonic() + timeout
        local.deploy(config, timeout)
        ep = local.endpoints(config)
        for url in local.health_urls(config):
            local.wait_healthy(url, max(1.0, deadline - time.monotonic()))
        local.save_state(ep)
    except BaseException:
        local.shutdown(drain=False)  # nothing was served yet
        raise
    click.echo(f"ready in {time.monotonic() - started:.0f}s")
    print_ready(ep, traces_url)
    if detach:
        click.echo("stop with: llm-serving down")
        return
    click.echo("Ctrl-C stops everything")
    wait_for_interrupt()
    click.echo("\nstopping ...")
    local.shutdown()
    click.echo("stopped")


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The changed platform config YAML.",
)
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for every app to run and answer its health check.",
)
@one_line_errors
def apply(config_path: str, timeout: float) -> None:
    """Apply a changed config to the running platform, as a RayService upgrade does. Replica
    counts and autoscaling bounds change in place (same replicas); an app whose own settings changed
    rolls, new replicas loading before old ones stop (max_surge_percent); other apps keep
    running. http.* and ray.* need `down` and `up`."""
    from serving.local import platform as local

    running = local.load_state()
    if running is None:
        raise local.PlatformError("no platform is running here; start one with `llm-serving up`")
    config, traces_url = keep_tracing(load_config(config_path))
    local.check_applicable(running, config)
    check_servable(config)
    for model_config in models_to_prepare(config):
        resolve_model(model_config.ref, model_config.cache_dir)
    started = time.monotonic()
    local.connect()
    deadline = time.monotonic() + timeout
    local.deploy(config, timeout)
    for url in local.health_urls(config):
        local.wait_healthy(url, max(1.0, deadline - time.monotonic()))
    local.save_state(local.endpoints(config))
    click.echo(f"applied in {time.monotonic() - started:.0f}s")
    print_ready(local.endpoints(config), traces_url)


def start_tracing(
    config: PlatformConfig, port: int, grpc_port: int
) -> tuple[PlatformConfig, str, bool]:
    """Start the local Phoenix (or reuse ours): the config with its spans sent there, Phoenix's
    URL and whether it was started now."""
    click.echo("starting Phoenix (traces) ...")
    server, started = backend.start_local(port, grpc_port)
    return backend.with_local_tracing(config, server), server.url, started


def keep_tracing(config: PlatformConfig) -> tuple[PlatformConfig, str | None]:
    """`apply` on a platform started with --tracing keeps sending spans to its Phoenix, so the
    same file deploys the same app args as `up --tracing` did (no restart)."""
    server = backend.running_local()
    if server is None:
        return config, None
    return backend.with_local_tracing(config, server), server.url


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def wait_for_interrupt() -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops cleanly, like Ctrl-C
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return


@main.command()
@one_line_errors
def down() -> None:
    """Stop Serve, the local Ray head and the Phoenix of `up --tracing`."""
    from serving.local import platform as local

    local.shutdown()
    click.echo("stopped")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@one_line_errors
def status(as_json: bool) -> None:
    """Applications, deployments, replicas and the engine's queue."""
    from serving.local import platform as local

    ep = local.load_state()
    if ep is None:
        raise local.PlatformError("no platform is running here; start one with `llm-serving up`")
    try:
        apps = local.serve_status()
    except ConnectionError as err:
        raise local.PlatformError(f"cannot reach the local Ray cluster: {err}") from None
    cold = cold_apps(apps)
    # A cold app's /health would be held until a replica starts (and start one): not asked.
    engines = {
        app: COLD_ENGINE if app in cold else local.engine_health(url)
        for app, url in local.engine_health_urls(ep).items()
    }
    if "models" in engines.get("vllm", {}):  # the models endpoint: each model's app's health
        engines |= {f"vllm-{name}": h for name, h in engines.pop("vllm")["models"].items()}
    caches = local.prefix_caches(ep.metrics_url)
    phoenix = backend.running_local()
    traces_url = phoenix.url if phoenix else None
    if as_json:
        document: dict[str, Any] = {
            "apps": apps,
            "cold": cold,
            "engines": engines,
            "prefix_cache": caches,
            "traces_url": traces_url,
        }
        click.echo(json.dumps(document, indent=2))
        return
    for name, app in apps.items():
        at_zero = " (cold: no replica running; the next request starts one)" if name in cold else ""
        click.echo(f"{name}: {app['status']}{at_zero}")
        for dname, dep in app["deployments"].items():
            replicas = ", ".join(f"{k}={v}" for k, v in dep["replicas"].items())
            click.echo(f"  {dname}: {dep['status']} ({replicas})")
        if name in engines:
            click.echo(f"  engine: {format_engine(engines[name])}")
    if caches:
        click.echo("prefix cache (prompt tokens found / looked up, since each replica started):")
    for row in caches:
        click.echo(
            f"  {row['model']} replica {row['replica']}: {row['hit_rate']:.0%} of "
            f"{row['queries']:.0f}"
        )
    click.echo(f"API {ep.api_url}  dashboard {ep.dashboard_url}  metrics {ep.metrics_url}")
    if traces_url:
        click.echo(f"traces {traces_url}")


ENGINE_DEPLOYMENT = "VLLMServer"
COLD_ENGINE: dict[str, Any] = {"status": "cold", "running": 0, "waiting": 0}


def cold_apps(apps: dict[str, Any]) -> list[str]:
    """The vLLM apps (a single model's, or each model's of `models`) whose engine deployment
    runs no replica now: scaled to zero, its next request waits for a cold start."""
    return sorted(
        name
        for name, app in apps.items()
        if ENGINE_DEPLOYMENT in app["deployments"]
        and not app["deployments"][ENGINE_DEPLOYMENT]["replicas"].get("RUNNING")
    )


def format_engine(health: dict) -> str:
    ttft = health.get("ttft_p50_ms_1m")
    ttft_text = "-" if ttft is None else f"{ttft:.0f} ms"
    return (
        f"{health.get('status')} queue={health.get('waiting')} running={health.get('running')} "
        f"ttft_p50_1m={ttft_text}"
    )


@main.group()
def adapters() -> None:
    """LoRA adapters of the served models."""


@adapters.command("demo")
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="Platform config YAML."
)
@one_line_errors
def adapters_demo(config_path: str | None) -> None:
    """Build the config's `demo:NAME` adapters (random-initialised LoRA, saved with peft) into the
    cache, where replicas find them; replicas build missing ones themselves."""
    from serving.config.adapters import DEMO_PREFIX, ensure_demo_adapter

    config = load_config(config_path)
    entries = [config.model_platform(entry) for entry in config.models] or [config]
    built = 0
    for platform in entries:
        demos = [a for a in platform.vllm.adapters if a.path.startswith(DEMO_PREFIX)]
        if not demos:
            continue
        model_dir = resolve_model(platform.model.ref, platform.model.cache_dir)
        for adapter in demos:
            name = adapter.path.removeprefix(DEMO_PREFIX)
            path = ensure_demo_adapter(model_dir, name, platform.model.cache_dir)
            click.echo(f"{adapter.name} ({platform.model.name}): {path}")
            built += 1
    if not built:
        raise ConfigError("the config names no `demo:` adapter")


main.add_command(analyze)
main.add_command(bench)
main.add_command(conformance)
main.add_command(render)
main.add_command(usage)
main.add_command(trace)

if __name__ == "__main__":
    main()

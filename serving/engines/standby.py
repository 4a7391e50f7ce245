"""A standby worker: an idle Ray worker process that has already imported what a vLLM replica
imports, so the next replica on the node (a scale-up, a start from zero, a replacement) starts in
it and skips torch's and vLLM's imports (6-8 s on the development machine, the largest phase of a
cold start after the engine core's own process, which `engine_core: inprocess` removes).

Two Ray mechanisms, no new process type: every worker started for a vLLM replica runs
`import_replica_modules` first (Ray's worker-process setup hook, set in the replica's runtime
env), and a serving replica asks its raylet to start one more such worker ahead of need (the
raylet's PrestartWorkers call, with the replica's own job and runtime env, which Serve's next
replica of the deployment will ask for). An idle worker of the same job and runtime env is
reused for the next actor; the keep-alive keeps it from being reaped as surplus."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

# ray._private.ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: a module path here is what Ray
# itself stores for `runtime_env={"worker_process_setup_hook": "<module path>"}`.
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
SETUP_HOOK = f"{__name__}.import_replica_modules"
# What a replica imports before it serves, when no replica has recorded its own list yet: the
# deployment, and what the engine core and vLLM's app import lazily.
REPLICA_MODULES = (
    "serving.deployments.vllm_server",
    "serving.engines.vllm_inproc",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.worker.cpu_worker",
    "vllm.renderers.hf",
    "vllm.entrypoints.launchers.app",
    "vllm.entrypoints.launchers.api_server.app_state",
    "xgrammar",
)
# A serving replica writes the modules it imported (vLLM imports many lazily: its engine loop,
# the model's class, each route of its app), and the next standby imports exactly those.
MODULES_FILE = "standby-modules.txt"


def standby_env() -> dict[str, str]:
    """The replica's runtime-env variables that make every worker started for it (on demand or
    as a standby) import a replica's modules before it takes the replica."""
    return {SETUP_HOOK_ENV: SETUP_HOOK}


def modules_file() -> Path:
    from serving.models import cache_root

    return cache_root() / MODULES_FILE


def record_replica_modules(path: Path, loaded: Mapping[str, object] = sys.modules) -> None:
    """Write the names of the imported modules that were loaded from files (written whole, then
    renamed: a standby starting meanwhile reads the old list or the new one)."""
    names = [name for name, module in list(loaded.items()) if getattr(module, "__file__", None)]
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("\n".join(names) + "\n")
    partial.replace(path)


def modules_to_import(path: Path) -> list[str]:
    """The recorded list, or REPLICA_MODULES before any replica recorded one."""
    try:
        recorded = path.read_text().split()
    except OSError:
        return list(REPLICA_MODULES)
    return recorded or list(REPLICA_MODULES)


def import_replica_modules() -> None:
    """Ray's setup hook. It never raises: a failing hook makes Ray kill the worker, and an
    import the replica really needs fails again, with its cause, in the replica."""
    failed = []
    for name in modules_to_import(modules_file()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  # a standby import is an optimisation only
            failed.append(name)
    if failed:
        logger.warning("standby worker: %d modules not imported, e.g. %s", len(failed), failed[0])


def prestart_standby(keep_alive_s: int) -> None:
    """Ask this node's raylet for one idle worker of this replica's job and runtime env, kept
    alive `keep_alive_s` (run from inside a replica, off its event loop)."""
    import ray
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    from ray.core.generated import runtime_environment_pb2 as runtime_env_pb2

    context = ray.get_runtime_context()
    node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
    channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
    env = runtime_env_pb2.RuntimeEnvInfo(  # type: ignore[attr-defined]  # protobuf, no stubs
        serialized_runtime_env=context.get_runtime_env_string()
    )
    request = node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]  # no stubs
        language=common_pb2.PYTHON,  # type: ignore[attr-defined]  # protobuf, no stubs
        job_id=bytes.fromhex(context.get_job_id()),
        runtime_env_info=env,
        keep_alive_duration_secs=keep_alive_s,
        num_workers=1,
    )
    node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=10)


async def leave_standby(
    keep_alive_s: int, in_flight: Callable[[], int], settle_s: float = 5.0, poll_s: float = 1.0
) -> None:
    """prestart_standby from a replica's event loop, once its engine is idle (`in_flight`: 0): the standby's
    imports take a core for seconds, which the requests that woke the replica (a start from zero
    serves them first) would otherwise share; `settle_s` lets those requests arrive. A refusal
    costs the next replica its imports only, so it is logged, not raised."""
    await asyncio.sleep(settle_s)
    while in_flight():
        await asyncio.sleep(poll_s)
    try:
        await asyncio.to_thread(record_replica_modules, modules_file())
        await asyncio.to_thread(prestart_standby, keep_alive_s)
    except Exception as err:  # noqa: BLE001  # the replica serves either way
        logger.warning("no standby worker left for the next replica: %s", err)

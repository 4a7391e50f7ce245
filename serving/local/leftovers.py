"""Processes that outlive `ray stop --force` on this machine, found and stopped by `down` (and
by a failed `up`): they are not Ray's own, so Ray does not stop them.

- Serve's HAProxy processes: they hold the HTTP port and Ray's fixed stats ports, so the next
  head's HAProxy could not bind.
- vLLM engine cores whose Ray node is gone: a replica's engine core is a child of its worker,
  which stops it on a clean shutdown, and the raylet (made subreaper, serving.config.ray_env) kills it
  when the worker dies alone. When the raylet itself is killed (`ray stop --force` after a drain
  that did not finish, or a failed `up` stopping at once) the core is left to init, waits for
  its frontend for ever and keeps the model's memory (1.7 GB of the default model's, seen after
  a test run)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

# Where Ray's Serve proxies keep their HAProxy configs (Ray's RAY_SERVE_HAPROXY_SERVER_STATE_BASE).
HAPROXY_BASE = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "/tmp/haproxy-serve")
# vLLM titles its engine-core process `VLLM::EngineCore` (a `_DP<n>` suffix with data parallel);
# the kernel keeps the first 15 characters as the process name (psutil may give the whole title).
ENGINE_CORE_TITLE = "VLLM::EngineCore"


def is_serve_haproxy(name: str, cmdline: list[str], base: str = HAPROXY_BASE) -> bool:
    """An HAProxy that a Serve proxy started: its config file lies under Ray's HAProxy base."""
    return name == "haproxy" and any(arg.startswith(base + "/") for arg in cmdline)


def is_engine_core(name: str, cmdline: list[str]) -> bool:
    return name.startswith(ENGINE_CORE_TITLE[:15]) or bool(
        cmdline and cmdline[0].startswith(ENGINE_CORE_TITLE)
    )


def raylet_gone(environ: Mapping[str, str], running: Callable[[int], bool]) -> bool:
    """The process was started under a Ray node (its worker's environment names the raylet) whose
    raylet no longer runs."""
    raylet = environ.get("RAY_RAYLET_PID", "")
    return raylet.isdigit() and not running(int(raylet))


def stop_leftovers() -> list[int]:
    """Kill Serve's HAProxy processes and engine cores whose Ray node is gone: their pids."""
    return stop_serve_haproxy() + stop_orphaned_engine_cores()


def stop_serve_haproxy() -> list[int]:
    return kill_where(lambda proc, name, cmdline: is_serve_haproxy(name, cmdline))


def stop_orphaned_engine_cores() -> list[int]:
    import psutil

    return kill_where(
        lambda proc, name, cmdline: (
            is_engine_core(name, cmdline) and raylet_gone(proc.environ(), psutil.pid_exists)
        )
    )


def kill_where(chosen: Callable[[Any, str, list[str]], bool]) -> list[int]:
    """Kill this machine's processes that `chosen(process, name, cmdline)` picks: their pids."""
    import psutil

    killed = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if chosen(proc, proc.info["name"] or "", proc.info["cmdline"] or []):
                proc.kill()
                killed.append(proc.pid)
        except psutil.Error:  # gone already, or not ours to read or stop
            continue
    return killed

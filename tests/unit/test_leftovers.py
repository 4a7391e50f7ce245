"""What `down` stops after `ray stop --force`: real processes titled as vLLM titles its engine
core, one under a raylet that is gone and one under a running one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from serving.local.leftovers import (
    ENGINE_CORE_TITLE,
    is_engine_core,
    raylet_gone,
    stop_orphaned_engine_cores,
)


def engine_core(raylet_pid: int) -> subprocess.Popen[bytes]:
    """A process titled as vLLM's engine core, started as if under the raylet `raylet_pid`."""
    code = (
        "import setproctitle, time\n"
        f"setproctitle.setproctitle({ENGINE_CORE_TITLE!r})\n"
        "time.sleep(120)\n"
    )
    # SPT_NOENV: setproctitle leaves the environment readable, as vLLM's engine core's is (its
    # argv leaves room for the title); without it the process could not be told to be Ray's.
    env = {**os.environ, "RAY_RAYLET_PID": str(raylet_pid), "SPT_NOENV": "1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def titled(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    process = psutil.Process(pid)
    while not is_engine_core(process.name(), process.cmdline()):
        assert time.monotonic() < deadline, "the process never took its title"
        time.sleep(0.05)


def test_an_engine_core_whose_raylet_is_gone_is_stopped_and_no_other() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a raylet pid that no longer runs
    orphan, served = engine_core(gone.pid), engine_core(os.getpid())
    try:
        titled(orphan.pid)
        titled(served.pid)
        stopped = stop_orphaned_engine_cores()
        assert orphan.pid in stopped and served.pid not in stopped
        assert orphan.wait(timeout=10) == -9
        assert served.poll() is None  # its raylet (here: this process) still runs
    finally:
        for proc in (orphan, served):
            proc.kill()
            proc.wait()


def test_only_an_engine_core_of_a_ray_node_that_is_gone_counts() -> None:
    assert is_engine_core("VLLM::EngineCor", ["VLLM::EngineCore"])
    assert is_engine_core("python", ["VLLM::EngineCore_DP0"])
    assert not is_engine_core("python", ["vllm", "serve", "model"])
    assert raylet_gone({"RAY_RAYLET_PID": "42"}, lambda pid: False)
    assert not raylet_gone({"RAY_RAYLET_PID": "42"}, lambda pid: True)
    assert not raylet_gone({}, lambda pid: False)  # not started under Ray: never ours to stop

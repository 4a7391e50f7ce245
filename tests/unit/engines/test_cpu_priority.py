"""The engine yields the CPU once it serves (real threads and processes; no vLLM). Only threads,
processes and interpreters the test starts get a higher niceness: the test process keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serving.config import PlatformConfig
from serving.engines.cpu_priority import child_thread_ids, lower_priority, thread_ids
from serving.engines.vllm import yield_cpu_to_control_plane


def niceness(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@contextmanager
def parked_thread() -> Iterator[int]:
    """A thread that waits until the block ends; yields its Linux thread id."""
    started, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def park() -> None:
        tid.append(threading.get_native_id())
        started.set()
        release.wait(30)

    thread = threading.Thread(target=park, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield tid[0]
    finally:
        release.set()
        thread.join(10)


def wait_until_gone(tid: int, timeout_s: float = 10.0) -> bool:
    """A joined Python thread's OS thread can outlive the join by a moment: wait it out."""
    deadline = time.monotonic() + timeout_s
    while tid in thread_ids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@contextmanager
def child_process() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def engine_config(accelerator: str, engine_core: str, cpu_niceness: int | None = 19):
    return PlatformConfig.model_validate(
        {
            "vllm": {
                "resources": {"accelerator": accelerator},
                "engine": {"engine_core": engine_core, "cpu_niceness": cpu_niceness},
            }
        }
    )


def test_thread_ids_lists_this_process_threads() -> None:
    with parked_thread() as tid:
        assert {threading.get_native_id(), tid} <= thread_ids()
    assert wait_until_gone(tid)


def test_lower_priority_raises_niceness_and_never_lowers_it() -> None:
    with parked_thread() as tid:
        start = niceness(tid)
        assert lower_priority([tid], start + 2) == 1
        assert niceness(tid) == start + 2
        assert lower_priority([tid], start + 1) == 0  # lowering needs privilege: left alone
        assert niceness(tid) == start + 2
    assert niceness(threading.get_native_id()) == start  # the caller's thread is untouched


def test_a_thread_that_has_exited_is_skipped() -> None:
    with parked_thread() as tid:
        pass
    assert wait_until_gone(tid)
    assert lower_priority([tid], 19) == 0


def test_child_thread_ids_cover_the_children() -> None:
    with child_process() as pid:
        assert pid in child_thread_ids()


def test_process_mode_lowers_the_engine_core_child() -> None:
    own = niceness(threading.get_native_id())
    with child_process() as pid:
        yield_cpu_to_control_plane(engine_config("cpu", "process"))
        assert niceness(pid) == 19
    assert niceness(threading.get_native_id()) == own


def test_inprocess_mode_lowers_every_thread_of_the_replica() -> None:
    """In a child interpreter: this one's own threads could not get their niceness back."""
    script = (
        "import os, threading\n"
        "from tests.unit.engines.test_cpu_priority import engine_config, parked_thread\n"
        "from serving.engines.vllm import yield_cpu_to_control_plane\n"
        "with parked_thread() as engine_thread:\n"
        "    yield_cpu_to_control_plane(engine_config('cpu', 'inprocess'))\n"
        "    print(os.getpriority(os.PRIO_PROCESS, engine_thread),"
        " os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parents[3],
    )
    assert done.stdout.split() == ["19", "19"]


def test_gpu_or_none_leaves_priorities_alone() -> None:
    own = niceness(threading.get_native_id())
    for config in (engine_config("gpu", "inprocess"), engine_config("cpu", "inprocess", None)):
        with parked_thread() as engine_thread:
            yield_cpu_to_control_plane(config)
            assert niceness(engine_thread) == own
        assert niceness(threading.get_native_id()) == own


def test_a_thread_we_may_not_change_is_skipped(monkeypatch) -> None:
    def refuse(*args: int) -> None:
        raise PermissionError("not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with parked_thread() as tid:
        assert lower_priority([tid], 19) == 0

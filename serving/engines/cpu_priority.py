"""CPU scheduling priority of a serving engine's compute threads.

On a CPU node the engine's forward passes take every core they can. A replica that is starting
(importing torch and vLLM, loading weights), Serve's proxy and controller, and the replica's own
HTTP streaming then get what decode leaves: under a burst a new replica started about twice as
slowly as on a quiet machine. Once an engine serves, its threads drop to a higher niceness, so
those come first and decode takes the rest of the CPU (all of it when nothing else runs). Linux
keeps niceness per thread and a new thread inherits its creator's, so every existing thread is
set, and threads they start later follow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil


def thread_ids(pid: int | None = None) -> set[int]:
    """Linux thread ids of a process (this one by default)."""
    try:
        return {thread.id for thread in psutil.Process(pid).threads()}
    except psutil.NoSuchProcess:
        return set()


def child_thread_ids() -> set[int]:
    """Threads of this process's descendants (vLLM's engine-core process, in `process` mode)."""
    children = psutil.Process().children(recursive=True)
    return set().union(*(thread_ids(child.pid) for child in children))


def lower_priority(tids: Iterable[int], niceness: int) -> int:
    """Raise each thread's niceness to `niceness` (never lower it: that needs privilege).
    Returns how many threads changed; a thread that has exited or is not ours to change is
    skipped: a replica serves either way."""
    changed = 0
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return changed

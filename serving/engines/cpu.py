"""How many CPU cores this process may use (affinity and the container's CPU quota), and torch
told so: Ray holds each worker to its num_cpus threads otherwise."""

from __future__ import annotations

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_cpu_limit(root: str = CGROUP_ROOT) -> float | None:
    """CPUs the container's quota allows (a pod's `limits.cpu`), None without a quota. cgroup v2:
    `cpu.max` ("200000 100000", or "max 100000"); v1: cpu.cfs_quota_us / cpu.cfs_period_us."""
    for quota_file, period_file in (
        ("cpu.max", None),
        ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"),
        ("cpu,cpuacct/cpu.cfs_quota_us", "cpu,cpuacct/cpu.cfs_period_us"),
    ):
        try:
            with open(os.path.join(root, quota_file)) as f:
                fields = f.read().split()
            if period_file is not None:
                with open(os.path.join(root, period_file)) as f:
                    fields.append(f.read().strip())
        except OSError:
            continue
        if len(fields) < 2 or fields[0] in ("max", "-1"):
            return None
        return int(fields[0]) / int(fields[1])
    return None


def cpu_cores(cgroup_root: str = CGROUP_ROOT) -> int:
    """Cores this process may use: its affinity (a cpuset), capped by the container's CPU quota
    (a pod limited to 4 CPUs on a 64-core node sees 64 cores but gets 4; 64 threads would
    thrash). A fractional quota rounds up: 1.5 CPUs still run 2 threads' worth in bursts."""
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is None:
        return cores
    return max(1, min(cores, math.ceil(limit)))


def use_all_cpu_cores() -> int:
    """Let torch use every core this process may use (affinity and CPU quota); returns the
    thread count.

    Ray sets OMP_NUM_THREADS to an actor's num_cpus (1) in each worker, so a transformers model
    in a replica would compute on one core while `generate()` in a script uses all of them.
    """
    import torch

    cores = cpu_cores()
    torch.set_num_threads(cores)
    return cores

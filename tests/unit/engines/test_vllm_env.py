"""The environment a vLLM replica sets before importing vLLM (no vLLM needed)."""

from __future__ import annotations

import pytest

from serving.config import PlatformConfig
from serving.engines.vllm import apply_engine_env


def config_on(accelerator: str) -> PlatformConfig:
    return PlatformConfig.model_validate({"vllm": {"resources": {"accelerator": accelerator}}})


def test_cpu_replica_lifts_rays_one_thread_cap() -> None:
    environ = {"OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "0"}
    apply_engine_env(config_on("cpu"), environ)
    assert "OMP_NUM_THREADS" not in environ
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert environ["VLLM_NO_USAGE_STATS"] == "0"  # an explicit setting wins


def test_cpu_threads_from_the_config_replace_rays_cap() -> None:
    config = PlatformConfig.model_validate(
        {"vllm": {"resources": {"accelerator": "cpu"}, "engine": {"cpu_threads": 2}}}
    )
    environ = {"OMP_NUM_THREADS": "1"}
    apply_engine_env(config, environ)
    assert environ["OMP_NUM_THREADS"] == "2"


def test_gpu_replica_keeps_the_thread_setting() -> None:
    environ = {"OMP_NUM_THREADS": "1"}
    apply_engine_env(config_on("gpu"), environ)
    assert environ["OMP_NUM_THREADS"] == "1"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ


def test_torch_gets_every_core_the_process_may_use(monkeypatch) -> None:
    import torch

    from serving.engines.cpu import use_all_cpu_cores

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})
    before = torch.get_num_threads()
    try:
        assert use_all_cpu_cores() == 3
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, 2),  # cgroup v2, a pod with limits.cpu 2
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs round up
        ({"cpu.max": "max 100000\n"}, 8),  # no quota: the affinity
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),
        ({"cpu.max": "1600000 100000\n"}, 8),  # a quota above the cpuset: the cpuset
        ({}, 8),  # no cgroup files at all (not Linux containers)
    ],
)
def test_cpu_cores_follow_the_container_quota(tmp_path, monkeypatch, files, expected) -> None:
    from serving.engines.cpu import cpu_cores

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert cpu_cores(str(tmp_path)) == expected


def test_vllms_own_n_cap_is_limits_max_n() -> None:
    environ: dict[str, str] = {}
    apply_engine_env(PlatformConfig.model_validate({"limits": {"max_n": 4}}), environ)
    assert environ["VLLM_MAX_N_SEQUENCES"] == "4"
    environ = {}
    apply_engine_env(PlatformConfig(), environ)
    assert environ["VLLM_MAX_N_SEQUENCES"] == "16"  # the default, not vLLM's 16384

"""The soak scenario's memory maths: growth after warm-up, trend, the gate, replica labels, and
reading a real process tree's RSS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from serving.loadgen import memory


def test_growth_compares_medians_after_warmup_with_the_end() -> None:
    # Warm-up (t < 10) grows fast and is ignored; afterwards 500 -> ~520 with one noisy spike.
    series = [
        (0, 100.0),
        (5, 400.0),
        (10, 500.0),
        (11, 502.0),
        (12, 501.0),
        (13, 900.0),
        (20, 519.0),
        (21, 520.0),
        (22, 521.0),
    ]
    growth = memory.replica_growth("vllm/VLLMServer/a", series, warmup_s=10, bound_mb=50)
    assert growth.after_warmup_mb == 501.0
    assert growth.end_mb == 520.0
    assert growth.growth_mb == 19.0
    assert growth.peak_mb == 900.0
    assert growth.within_bound is True
    assert growth.samples == 9


def test_growth_beyond_the_bound_fails_the_gate() -> None:
    series = [(float(t), 300.0 + 10 * t) for t in range(30)]  # 10 MiB/s, a leak
    growth = memory.replica_growth("r", series, warmup_s=5, bound_mb=200)
    assert growth.growth_mb == pytest.approx(220.0)  # median(t=5..7) to median(t=27..29)
    assert growth.slope_mb_per_min == pytest.approx(600.0)
    assert growth.within_bound is False
    assert memory.memory_held([growth]) is False


def test_too_few_samples_after_warmup_is_not_measured() -> None:
    growth = memory.replica_growth(
        "r", [(0, 100.0), (1, 120.0), (9, 130.0)], warmup_s=5, bound_mb=1
    )
    assert growth.growth_mb is None and growth.within_bound is None
    assert memory.memory_held([growth]) is False  # nothing measured is not a pass


def test_growth_by_replica_splits_interleaved_samples() -> None:
    samples = [
        (float(t), name, base + t) for t in range(10) for name, base in (("b", 50), ("a", 10))
    ]
    growths = memory.growth_by_replica(samples, warmup_s=2, bound_mb=100)
    assert [g.replica for g in growths] == ["a", "b"]
    assert all(g.growth_mb == 5.0 for g in growths)  # median(7,8,9) - median(2,3,4)
    assert memory.memory_held(growths) is True


def test_slope_needs_two_distinct_times() -> None:
    assert memory.least_squares_slope([(1.0, 5.0), (1.0, 6.0)]) is None
    assert memory.least_squares_slope([(0.0, 1.0), (2.0, 5.0)]) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("duration", "interval", "warmup"), [(60, 1.0, 15.0), (600, 6.0, 120.0), (5000, 10.0, 120.0)]
)
def test_interval_and_warmup_scale_with_the_duration(
    duration: float, interval: float, warmup: float
) -> None:
    assert memory.sampling_interval_s(duration) == interval
    assert memory.default_warmup_s(duration) == warmup


def test_replica_label_from_serve_actor_name() -> None:
    assert memory.replica_label("SERVE_REPLICA::vllm#VLLMServer#x1y2") == "vllm/VLLMServer/x1y2"


def test_process_tree_rss_counts_children() -> None:
    import psutil

    child = subprocess.Popen(
        [sys.executable, "-c", "b = bytearray(64 * 2**20); print('ok', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ok"  # the child holds its 64 MiB now
        own = memory.process_tree_rss_mb(os.getpid())
        alone = psutil.Process(os.getpid()).memory_info().rss / memory.MIB
        assert own is not None and own >= alone + 60
    finally:
        child.kill()
        child.wait()
    assert memory.process_tree_rss_mb(child.pid) is None  # a gone process reads as None

"""Queue-depth autoscaling on the CPU: a burst takes a vLLM deployment from 1 to 2 replicas and,
after the load ends, back to 1, with every request answered. Bounded in count and time."""

from __future__ import annotations

import asyncio
import threading
import time

import openai

from serving.config import parse_config
from serving.deployments.vllm_server import build_vllm_app
from tests.integration.conftest import Platform, extra_app

APP, PREFIX = "autoscale", "/autoscale"


def autoscaling_config() -> dict:
    return {
        "model": {"ref": "tiny-qwen2", "max_model_len": 1024, "dtype": "float32"},
        "vllm": {
            "route_prefix": PREFIX,
            "engine": {"kv_cache_memory_gb": 0.25, "max_num_seqs": 8},
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_queue_depth": 4,
                            "upscale_delay_s": 1, "downscale_delay_s": 8, "look_back_period_s": 2},
        },
    }


def replica_counts() -> tuple[int, int]:
    """(running, all) replicas; a STARTING one appears as soon as the autoscaler decides."""
    from ray import serve

    states = dict(serve.status().applications[APP].deployments["VLLMServer"].replica_states)
    return int(states.get("RUNNING", 0)), sum(states.values())


def running_replicas() -> int:
    return replica_counts()[0]


class ReplicaTimeline:
    """Samples the running replica count every 0.5 s in a thread until stopped."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (time, running, all replicas)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), *replica_counts()))
            self._stop.wait(0.5)

    def __enter__(self) -> ReplicaTimeline:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def first_time(self, replicas: int, after: float) -> float | None:
        """When `replicas` were first RUNNING at or after `after`."""
        return next((t for t, n, _ in self.samples if t >= after and n == replicas), None)

    def first_decision(self, replicas: int, after: float) -> float | None:
        """When the autoscaler first asked for `replicas` (counting STARTING ones)."""
        return next((t for t, _, n in self.samples if t >= after and n >= replicas), None)


async def burst(base_url: str, requests: int, max_tokens: int) -> list[str]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

    async def one(i: int) -> str:
        try:
            r = await client.completions.create(
                model="tiny-qwen2", prompt=f"Burst {i}", max_tokens=max_tokens,
                extra_body={"ignore_eos": True},
            )
            return "ok" if r.usage.completion_tokens == max_tokens else "short"
        except openai.APIStatusError as err:  # a refusal must be a 503 with Retry-After
            retry = err.response.headers.get("retry-after")
            return "refused" if err.status_code == 503 and retry else f"error {err.status_code}"

    return await asyncio.gather(*[one(i) for i in range(requests)])


def test_burst_scales_vllm_up_to_two_replicas_and_back(platform: Platform) -> None:
    config = parse_config(autoscaling_config())
    with extra_app(APP, PREFIX, build_vllm_app(config)), ReplicaTimeline() as timeline:
        assert running_replicas() == 1
        start = time.monotonic()
        # Waves of requests until the second replica serves (bounded: 8 waves at most).
        outcomes: list[str] = []
        for _ in range(8):
            outcomes += asyncio.run(burst(f"{platform.url}{PREFIX}/v1", requests=24, max_tokens=200))
            if timeline.first_time(2, start) is not None:
                break
        load_end = time.monotonic()
        up_at = timeline.first_time(2, start)
        decided_at = timeline.first_decision(2, start)
        assert up_at is not None, f"never scaled to 2 replicas: {timeline.samples[-5:]}"
        deadline = time.monotonic() + 300  # bounded; usually ~15 s (downscale delay 8 s)
        while time.monotonic() < deadline and running_replicas() != 1:
            time.sleep(1)
        down_at = timeline.first_time(1, load_end)
    assert set(outcomes) <= {"ok", "refused"}, outcomes
    assert outcomes.count("ok") > 0
    assert down_at is not None, f"never scaled back to 1: {timeline.samples[-5:]}"
    print(f"\nautoscaling: scale-up decided {decided_at - start:.1f}s and second replica "
          f"serving {up_at - start:.1f}s after the burst began; "
          f"back to 1 replica {down_at - load_end:.1f}s after the load ended; "
          f"{outcomes.count('ok')} completed, {outcomes.count('refused')} refused")

"""Long streams through HAProxy reloads: every replica change anywhere reloads every HAProxy, and
the old process, which still carries the open connections, is killed `hard-stop-after` seconds
later (http.haproxy_hard_stop_s, by default the drain deadline). A stream opened before a
scale-up and a scale-down completes when it ends within that time and is cut when it does not.

The streams come from a small deployment that writes one line a second, not from vLLM: the tiny
test model writes its 1024 tokens in seconds, and HAProxy treats every open connection alike.
The scale (hard stop and stream lengths) comes from LLM_SERVING_LONG_STREAMS (conftest.py)."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from serving.config import load_config
from serving.config.ray_env import drain_deadline_s, haproxy_hard_stop_s
from tests.integration.conftest import (
    LONG_STREAM_SCALE,
    LONG_STREAM_SCALES,
    Platform,
    extra_app,
)
from tests.integration.streams import wait_until

APP, PREFIX = "long-streams", "/long-streams"
# The cut comes within a few seconds of reload + hard stop (HAProxy's timer, our 0.25 s polls).
CUT_EARLY_S, CUT_LATE_S = 3.0, 10.0
HARD_STOP_LINE = re.compile(r"^\s*hard-stop-after\s+(\d+)s", re.MULTILINE)


def lines_app(num_replicas: int, longest_s: int) -> Any:
    """A deployment streaming `?seconds=N` lines, one a second, then `done`. Defined here, so
    Ray ships it by value; one version, so a new num_replicas is a scale in place, not a
    rollout; a stopping replica keeps its streams (graceful shutdown) past the longest."""
    import asyncio

    from ray import serve
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

    @serve.deployment(
        name="Lines",
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=longest_s + 60,
    )
    class Lines:
        async def __call__(self, request: Request) -> StreamingResponse:
            seconds = int(request.query_params["seconds"])

            async def lines() -> Any:
                for n in range(seconds):
                    yield f"{n}\n"
                    await asyncio.sleep(1)
                yield "done\n"

            return StreamingResponse(lines(), media_type="text/plain")

    deployment: Any = Lines  # a serve.Deployment (the decorator's type is lost to mypy)
    # Ray 2.60 refuses a user `version` and gives each serve.run a random code version (a
    # rollout); the config path (`llm-serving apply`) hashes an import path this test's app has
    # not. Serve's own internal flag keeps one version, as the config path would.
    return deployment.options(num_replicas=num_replicas, version="1", _internal=True).bind()


@dataclass
class LineStream:
    """A GET of `seconds` lines read in a thread; how far it got and how it ended."""

    url: str
    seconds: int
    lines: int = 0
    done: bool = False
    error: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    first_line: threading.Event = field(default_factory=threading.Event)

    def start(self) -> LineStream:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        self.started_at = time.monotonic()
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(10.0, read=30.0)) as client,
                client.stream("GET", self.url, params={"seconds": self.seconds}) as response,
            ):
                for line in response.iter_lines():
                    self.done = line == "done"
                    self.lines += not self.done
                    self.first_line.set()
        except httpx.HTTPError as err:
            self.error = f"{type(err).__name__}: {err}"[:200]
        self.ended_at = time.monotonic()
        self.first_line.set()

    def wait(self, timeout_s: float) -> float | None:
        """Seconds until the stream ended, or None after `timeout_s`."""
        return wait_until(lambda: self.ended_at > 0, timeout_s=timeout_s, poll_s=0.5)

    @property
    def completed(self) -> bool:
        return self.done and self.lines == self.seconds and not self.error


def haproxy_processes() -> dict[int, psutil.Process]:
    """Ray's HAProxy processes on this machine (the loopback wrapper execs the real binary)."""
    found = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "haproxy" and "-f" in (proc.info["cmdline"] or []):
            found[proc.pid] = proc
    return found


def configured_hard_stop(proc: psutil.Process) -> int | None:
    """`hard-stop-after` of the config file HAProxy was started with."""
    args = proc.cmdline()
    text = Path(args[args.index("-f") + 1]).read_text()
    match = HARD_STOP_LINE.search(text)
    return int(match.group(1)) if match else None


class HAProxyWatch:
    """HAProxy pids seen, polled every 0.25 s in a thread for at most `limit_s`: when each was
    first and last seen (a new pid is a reload, a vanished one a finished or killed process)."""

    def __init__(self, limit_s: float) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._limit_s = limit_s
        self._poll()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        now = time.monotonic()
        for pid in haproxy_processes():
            self.first.setdefault(pid, now)
            self.last[pid] = now

    def _run(self) -> None:
        deadline = time.monotonic() + self._limit_s
        while not self._stop.wait(0.25) and time.monotonic() < deadline:
            self._poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def new_since(self, moment: float) -> list[int]:
        """Pids first seen after `moment`, oldest first: the reloads since."""
        return sorted(
            (p for p, t in self.first.items() if t > moment), key=lambda pid: self.first[pid]
        )


def answers(url: str) -> bool:
    try:
        return httpx.get(url, params={"seconds": 0}, timeout=5).text == "done\n"
    except httpx.HTTPError:
        return False


def running(replicas: int) -> bool:
    """The app has exactly `replicas` replicas, all running."""
    from ray import serve

    deployment = serve.status().applications[APP].deployments["Lines"]
    return dict(deployment.replica_states) == {"RUNNING": replicas}


def scale(num_replicas: int, longest_s: int) -> None:
    from ray import serve

    serve.run(lines_app(num_replicas, longest_s), name=APP, route_prefix=PREFIX)


def test_streams_outlive_replica_changes_until_the_hard_stop(platform: Platform) -> None:
    config = load_config(platform.config_path)
    hard_stop_s = haproxy_hard_stop_s(config)
    configured, lengths = LONG_STREAM_SCALES[LONG_STREAM_SCALE]
    assert hard_stop_s == (configured or drain_deadline_s(config))
    url = f"{platform.url}{PREFIX}"
    with extra_app(APP, PREFIX, lines_app(1, max(lengths))):
        # Once the route answers, HAProxy has reloaded for the new app: the streams land on
        # the process that the scale-up then replaces.
        assert wait_until(lambda: answers(url), timeout_s=30, poll_s=0.25) is not None
        current = max(haproxy_processes().values(), key=lambda p: p.create_time())
        assert configured_hard_stop(current) == hard_stop_s  # what Ray wrote from our env
        watch = HAProxyWatch(limit_s=max(lengths) + 120)
        streams = [LineStream(url, seconds).start() for seconds in lengths]
        assert all(s.first_line.wait(30) and not s.error for s in streams), streams
        up_at = time.monotonic()
        scale(2, max(lengths))  # a second replica comes: every HAProxy reloads
        up_s = wait_until(lambda: running(2) and bool(watch.new_since(up_at)), 60, 0.25)
        down_at = time.monotonic()
        scale(1, max(lengths))  # and goes: another reload
        down_s = wait_until(lambda: running(1) and bool(watch.new_since(down_at)), 60, 0.25)
        ends = [stream.wait(timeout_s=stream.seconds + 60) for stream in streams]
        watch.stop()
    assert up_s is not None and down_s is not None, f"no reload seen: {watch.first}"
    reloads = watch.new_since(up_at)
    reload_at = watch.first[reloads[0]]
    old_gone_at = watch.last[current.pid]
    report = [
        (s.seconds, s.lines, s.done, round(s.ended_at - reload_at, 1), s.error) for s in streams
    ]
    print(
        f"\nlong streams ({LONG_STREAM_SCALE}, hard stop {hard_stop_s} s): scale-up asked at "
        f"{up_at - reload_at:.1f} s, scale-down at {down_at - reload_at:.1f} s, reloads at "
        f"{[round(watch.first[p] - reload_at, 1) for p in reloads]} s; the old HAProxy "
        f"{current.pid} last seen at {old_gone_at - reload_at:.1f} s; streams "
        f"(seconds, lines, done, ended at s, error): {report} (times from the first reload)"
    )
    assert watch.first[reloads[0]] < down_at and watch.new_since(down_at), watch.first
    assert all(end is not None for end in ends), report
    # The old process carried the streams past the reloads: it lived until the first one ended.
    assert old_gone_at >= min(s.ended_at for s in streams) - 1, report
    for stream in streams:
        cut_at = reload_at + hard_stop_s  # the old process is killed then
        if stream.started_at + stream.seconds < cut_at - CUT_EARLY_S:
            assert stream.completed, report  # it ended before the old process was killed
        else:
            assert not stream.completed and stream.lines < stream.seconds, report
            assert cut_at - CUT_EARLY_S < stream.ended_at < cut_at + CUT_LATE_S, report
    if LONG_STREAM_SCALE == "ci":  # both sides of the hard stop, in one run
        assert [s.completed for s in streams] == [True, False], report

"""Where a vLLM replica's start-up goes. The engine core logs its phases (in a child process, or
in the replica with `engine_core: inprocess`); vLLM's own logging config (inherited by a child
through the environment) gets one more handler that copies just those lines, with their
timestamps, to a small file the replica reads once the engine is up. Marker names follow vLLM
0.32's log messages; `startup_phases` turns the replica's moments into the named phases that
/health, the replica's metrics and `llm-serving bench coldstart` all report."""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
from pathlib import Path

# Message prefix -> the moment it marks (vLLM's wording; a missing marker drops its phases only).
MARKERS = {
    "Initializing a V1 LLM engine": "engine_process_up",  # child imported vLLM, EngineCore starts
    "Starting to load model": "model_load_start",
    "Loading weights took": "model_loaded",
    # vLLM CPU warms up inside its memory profiling, before it sizes the KV cache; GPU workers
    # log no such pair (their warm-up and graph capture stay in kv_cache_allocated).
    "Warming up model for the compilation": "warmup_start",
    "Warming up done": "warmup_done",
    "init engine (profile, create kv cache, warmup model) took": "kv_cache_warmed_up",
}
# (phase, from marker, to marker); "start"/"ready" are the replica's own clock around the call.
PHASES = (
    ("engine_process_spawn_import", "start", "engine_process_up"),  # in-process: no spawn
    ("engine_device_init", "engine_process_up", "model_load_start"),
    ("model_load", "model_load_start", "model_loaded"),
    ("kv_cache_profile_warmup", "model_loaded", "kv_cache_warmed_up"),
    ("engine_handshake", "kv_cache_warmed_up", "ready"),
)
ENV = "VLLM_LOGGING_CONFIG_PATH"

# The phases of a replica start, in order, each the seconds between two moments (epoch seconds,
# see `startup_phases`); `first_request_served` is their sum, process start -> first token.
# SCHEDULED (Serve starts the replica -> its process exists) needs the moment Serve's controller
# started it (`serve_started`), which only the outside knows: the coldstart bench adds it.
SCHEDULED = "scheduled"
STARTUP_PHASES = (
    "process_up",  # the replica's process exists -> it imports the platform (Ray worker boot)
    "imports",  # -> engine core up: the replica module (vLLM), Serve, engine process + imports
    "weights_loaded",  # engine core up -> weights loaded (device init included)
    "kv_cache_allocated",  # weights -> engine initialized: profiling, KV cache, less warm-up
    "warmup",  # vLLM's warm-up forward passes, where it logs them (CPU)
    "replica_ready",  # engine initialized -> replica constructed (handshake, vLLM's app)
    "first_token",  # replica ready -> the first request's first token
)
FIRST_REQUEST_SERVED = "first_request_served"
SPANS = {
    SCHEDULED: ("serve_started", "process_created"),
    "process_up": ("process_created", "platform_imported"),
    "imports": ("platform_imported", "engine_process_up"),
    "weights_loaded": ("engine_process_up", "model_loaded"),
    "kv_cache_allocated": ("model_loaded", "kv_cache_warmed_up"),
    "warmup": ("warmup_start", "warmup_done"),
    "replica_ready": ("kv_cache_warmed_up", "replica_ready"),
    "first_token": ("replica_ready", "first_token"),
    FIRST_REQUEST_SERVED: ("process_created", "first_token"),
}
# Moments a start outside a replica (or an older replica) lacks, and what stands in for them.
STAND_INS = (
    ("replica_init", "engine_start"),
    ("platform_imported", "replica_init"),
    ("replica_ready", "engine_ready"),
)
# Ray may hand the replica a worker process started (and importing) before Serve asked for it:
# with `serve_started` known, these moments count from it at the earliest.
BEFORE_THE_REPLICA = ("process_created", "platform_imported", "replica_init")


class PhaseFileHandler(logging.FileHandler):
    """Writes `created<TAB>marker` for the start-up messages only (a few lines per replica)."""

    def emit(self, record: logging.LogRecord) -> None:
        marker = marker_of(str(record.msg))
        if marker is not None:
            self.stream = self.stream or self._open()
            self.stream.write(f"{record.created}\t{marker}\n")
            self.flush()


def marker_of(message: str) -> str | None:
    return next((name for prefix, name in MARKERS.items() if message.startswith(prefix)), None)


def install_phase_log() -> Path | None:
    """vLLM's default logging plus the phase handler, for the engine this replica configures next
    (vLLM's config copies the path; the engine process applies it). None when the user configured
    vLLM's logging themselves (theirs wins)."""
    if os.environ.get(ENV):
        return None
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    fd, name = tempfile.mkstemp(prefix="vllm-startup-", suffix=".tsv")
    os.close(fd)
    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["handlers"]["startup_phases"] = {
        "class": f"{__name__}.PhaseFileHandler",
        "filename": name,
        "level": "INFO",
        "delay": True,
    }
    config["loggers"]["vllm"]["handlers"].append("startup_phases")
    config_path = Path(name).with_suffix(".json")
    config_path.write_text(json.dumps(config))
    os.environ[ENV] = str(config_path)
    return Path(name)


def read_markers(path: Path | None) -> dict[str, float]:
    """marker -> first time (epoch seconds) it was logged."""
    marks: dict[str, float] = {}
    if path is None or not path.exists():
        return marks
    for line in path.read_text().splitlines():
        created, _, marker = line.partition("\t")
        marks.setdefault(marker, float(created))
    return marks


def phase_seconds(marks: dict[str, float]) -> dict[str, float]:
    """Seconds per phase whose two ends are known, in start-up order."""
    return {
        name: round(marks[end] - marks[begin], 2)
        for name, begin, end in PHASES
        if begin in marks and end in marks
    }


def known_moments(at: dict[str, float]) -> dict[str, float]:
    """`at` with its stand-ins, and nothing of the replica's before Serve started it."""
    moments = dict(at)
    for name, stand_in in STAND_INS:
        if name not in moments and stand_in in moments:
            moments[name] = moments[stand_in]
    if "serve_started" in moments:
        for name in BEFORE_THE_REPLICA:
            if name in moments:
                moments[name] = max(moments[name], moments["serve_started"])
    return moments


def startup_phases(at: dict[str, float]) -> dict[str, float]:
    """Seconds per named phase whose two moments are known (SCHEDULED, STARTUP_PHASES, then
    first_request_served). Outside a replica the engine's own ends stand in for the
    constructor's (STAND_INS); the warm-up vLLM logs inside the KV-cache step is counted once, as
    warmup. Without `serve_started` a pre-started worker's wait counts as process_up."""
    moments = known_moments(at)
    seconds = {
        name: moments[end] - moments[begin]
        for name, (begin, end) in SPANS.items()
        if begin in moments and end in moments
    }
    if "kv_cache_allocated" in seconds and "warmup" in seconds:
        seconds["kv_cache_allocated"] -= seconds["warmup"]
    return {name: round(value, 2) for name, value in seconds.items()}


def remove_phase_log(path: Path | None) -> None:
    """Forget the files; the engine process keeps its open handle (nothing more is written)."""
    if path is not None:
        os.environ.pop(ENV, None)
        for file in (path, path.with_suffix(".json")):
            file.unlink(missing_ok=True)

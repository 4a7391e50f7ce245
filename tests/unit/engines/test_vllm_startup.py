"""The start-up breakdown of a vLLM replica: which log lines mark which moment, and the phase
maths over those moments (no vLLM needed)."""

from __future__ import annotations

import logging
from pathlib import Path

from serving.engines import vllm_startup as startup


def test_markers_come_from_vllms_messages() -> None:
    assert startup.marker_of("Loading weights took %.2f seconds") == "model_loaded"
    assert startup.marker_of(
        "init engine (profile, create kv cache, warmup model) took %.2f s"
    ) == ("kv_cache_warmed_up")
    assert startup.marker_of("Using max model len 1024") is None


def test_the_handler_writes_only_marked_records(tmp_path: Path) -> None:
    path = tmp_path / "phases.tsv"
    handler = startup.PhaseFileHandler(str(path), delay=True)
    log = logging.getLogger("test_vllm_startup")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.info("Chunked prefill is enabled")
        log.info("Starting to load model %s...", "/m")
        log.info("Loading weights took %.2f seconds", 0.5)
    finally:
        log.removeHandler(handler)
        handler.close()
    marks = startup.read_markers(path)
    assert list(marks) == ["model_load_start", "model_loaded"]
    assert marks["model_loaded"] >= marks["model_load_start"] > 0


def test_phases_are_the_gaps_between_known_moments() -> None:
    marks = {
        "start": 100.0,
        "engine_process_up": 109.5,
        "model_load_start": 110.0,
        "model_loaded": 112.25,
        "kv_cache_warmed_up": 113.0,
        "ready": 113.5,
    }
    assert startup.phase_seconds(marks) == {
        "engine_process_spawn_import": 9.5,
        "engine_device_init": 0.5,
        "model_load": 2.25,
        "kv_cache_profile_warmup": 0.75,
        "engine_handshake": 0.5,
    }


def test_a_missing_marker_drops_only_its_phases() -> None:
    marks = {"start": 100.0, "engine_process_up": 109.5, "ready": 113.5}
    assert startup.phase_seconds(marks) == {"engine_process_spawn_import": 9.5}
    assert startup.read_markers(None) == {}


def test_vllms_cpu_warm_up_lines_are_markers() -> None:
    assert startup.marker_of("Warming up model for the compilation...") == "warmup_start"
    assert startup.marker_of("Warming up done.") == "warmup_done"


def replica_moments() -> dict[str, float]:
    return {
        "process_created": 100.0,
        "platform_imported": 100.5,
        "replica_init": 101.0,
        "engine_start": 101.5,
        "engine_process_up": 110.0,
        "model_loaded": 111.0,
        "warmup_start": 111.5,
        "warmup_done": 114.0,
        "kv_cache_warmed_up": 115.0,
        "engine_ready": 115.5,
        "replica_ready": 116.0,
        "first_token": 117.25,
    }


def test_named_phases_are_the_gaps_and_add_up_to_the_first_request() -> None:
    phases = startup.startup_phases(replica_moments())
    assert phases == {
        "process_up": 0.5,
        "imports": 9.5,
        "weights_loaded": 1.0,
        "kv_cache_allocated": 1.5,  # 4 s from weights to engine ready, less 2.5 s of warm-up
        "warmup": 2.5,
        "replica_ready": 1.0,
        "first_token": 1.25,
        "first_request_served": 17.25,
    }
    assert list(phases)[:-1] == list(startup.STARTUP_PHASES)
    assert sum(phases[name] for name in startup.STARTUP_PHASES) == phases["first_request_served"]


def test_outside_a_replica_the_engines_own_ends_stand_in() -> None:
    moments = replica_moments()
    dropped = ("platform_imported", "replica_init", "replica_ready", "first_token", "warmup_start")
    for name in (*dropped, "warmup_done"):
        del moments[name]
    phases = startup.startup_phases(moments)
    assert phases["process_up"] == 1.5  # process start -> engine start
    assert (phases["imports"], phases["kv_cache_allocated"], phases["replica_ready"]) == (
        8.5,
        4.0,
        0.5,
    )
    assert "first_token" not in phases and "warmup" not in phases
    assert "first_request_served" not in phases
    assert startup.startup_phases({}) == {}


def test_with_serves_start_nothing_of_the_replica_counts_before_it() -> None:
    moments = {**replica_moments(), "serve_started": 100.75}  # the process was started earlier
    phases = startup.startup_phases(moments)
    assert (phases["scheduled"], phases["process_up"], phases["imports"]) == (0.0, 0.0, 9.25)
    assert phases["first_request_served"] == 16.5
    assert sum(phases[name] for name in startup.STARTUP_PHASES) == phases["first_request_served"]
    later = startup.startup_phases({**replica_moments(), "serve_started": 99.5})
    assert (later["scheduled"], later["process_up"]) == (0.5, 0.5)

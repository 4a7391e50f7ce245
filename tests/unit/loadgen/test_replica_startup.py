"""The start-up phases the benches report: a replica's /health recounted from Serve's start of
it (the dashboard's start_time_s), a worker Ray started beforehand counted from there."""

from __future__ import annotations

from serving.loadgen import replica_startup


def test_serves_start_of_the_replica_that_answered_splits_the_time_before_its_process() -> None:
    deployment = {
        "replicas": [
            {"replica_id": "old", "start_time_s": 990.0},
            {"replica_id": "new", "start_time_s": 1000.5},
            {"replica_id": "starting", "start_time_s": 0},  # Serve's value before it starts one
        ]
    }
    assert replica_startup.serve_start_time(deployment, "new") == 1000.5
    assert replica_startup.serve_start_time(deployment, "old") == 990.0
    assert replica_startup.serve_start_time(deployment, "") == 1000.5  # no header: the latest
    assert replica_startup.serve_start_time({"replicas": []}, "new") is None


def health(process_created: float) -> dict:
    at = {
        "process_created": process_created,
        "platform_imported": 1003.0,
        "replica_init": 1004.0,
        "first_token": 1010.0,
    }
    return {"startup_s": {"import_vllm": 0.5, "process_up": 99.0}, "startup_at": at}


def test_the_replicas_phases_count_from_serves_start_of_it() -> None:
    phases = replica_startup.replica_phases(health(1001.25), 1000.5)
    assert phases == {
        "import_vllm": 0.5,  # the engine's own timings pass through
        "scheduled": 0.75,
        "process_up": 1.75,  # recounted from the moments
        "first_request_served": 8.75,
    }


def test_a_worker_ray_started_beforehand_was_scheduled_at_once() -> None:
    phases = replica_startup.replica_phases(health(900.0), 1000.5)  # the process waited 100 s
    assert (phases["scheduled"], phases["process_up"]) == (0.0, 2.5)
    assert phases["first_request_served"] == 9.5
    # without Serve's start the replica's own view: the wait counts as process_up
    assert replica_startup.replica_phases(health(900.0), None)["process_up"] == 103.0


def test_without_replica_ids_the_latest_start_before_the_constructor_is_the_replicas() -> None:
    starts = [990.0, 1000.5, 1002.0, 1005.0]
    assert replica_startup.serve_start_before(starts, health(1001.25)) == 1002.0  # init 1004
    assert replica_startup.serve_start_before([1005.0], health(1001.25)) is None
    assert replica_startup.serve_start_before(starts, {"startup_s": {}}) is None

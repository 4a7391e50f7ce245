"""State outlives the platform: a stored Responses chain and a batch survive the platform being
killed mid-batch (Ray stopped at once, nothing drained, as a crash or a node loss) and started
again with `llm-serving up`. The chain (10 responses) reads back and each of its responses takes
a follow-up; the batch resumes where it stopped and ends with exactly one output line per input
line (none lost, none twice)."""

from __future__ import annotations

import time

from serving.config import load_config
from serving.local import platform as local
from serving.state.store import open_store
from tests.integration.conftest import Platform, run_cli
from tests.integration.test_batches import check_batch_complete, start_batch
from tests.integration.test_stored_responses import DONE, SHORT, check_chain, stored_chain

LINES = 500
KILL_WAIT_S = 300  # bound on waiting for the batch's first finished lines


def completed_lines(platform: Platform, batch_id: str) -> int:
    counts = platform.client().batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def test_responses_and_a_batch_outlive_a_killed_platform(platform: Platform) -> None:
    client = platform.client()
    chain = stored_chain(client, turns=10)
    batch_id = start_batch(client, LINES)
    deadline = time.monotonic() + KILL_WAIT_S
    while completed_lines(platform, batch_id) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    local.shutdown(drain=False)  # `ray stop --force`: replicas killed with lines in flight
    # Read in the store itself while nothing runs: the new replicas resume the batch at once.
    at_kill = open_store(load_config(platform.config_path).state).line_counts(batch_id)
    print(f"\nkilled with batch lines {at_kill}")
    assert 0 < at_kill["completed"] < LINES, "the platform was not killed mid-batch"
    started = run_cli("up", "--detach", "--config", str(platform.config_path))
    assert started.returncode == 0, started.stdout + started.stderr
    check_chain(client, chain)  # 10 of 10 read back, on a replica that did not write them
    follow_ups = [
        client.responses.create(input="Go on.", previous_response_id=id, **SHORT) for id in chain
    ]
    assert [f.previous_response_id for f in follow_ups] == chain
    assert all(f.status in DONE for f in follow_ups)
    check_batch_complete(client, batch_id, LINES)

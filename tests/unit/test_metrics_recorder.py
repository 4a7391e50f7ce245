"""The metrics recorder: updates leave the request path and run in order on their own thread."""

import threading

from serving.metrics import BackgroundRecorder


def test_submit_returns_while_an_update_is_still_blocked():
    recorder = BackgroundRecorder()
    release, started = threading.Event(), threading.Event()
    done: list[str] = []

    def slow(name: str) -> None:
        started.set()
        release.wait(10)
        done.append(name)

    recorder.submit(slow, "first")
    assert started.wait(10)
    recorder.submit(done.append, "second")  # returns although the recorder is busy
    assert done == []
    release.set()
    recorder.flush()
    assert done == ["first", "second"]


def test_updates_run_in_order_off_the_caller_thread():
    recorder = BackgroundRecorder()
    seen: list[tuple[int, int]] = []
    for i in range(100):
        recorder.submit(lambda i=i: seen.append((i, threading.get_ident())))
    recorder.flush()
    assert [i for i, _ in seen] == list(range(100))
    assert {thread for _, thread in seen} != {threading.get_ident()}


def test_a_failing_update_does_not_stop_the_next():
    recorder = BackgroundRecorder()
    done: list[int] = []
    recorder.submit(lambda: 1 / 0)
    recorder.submit(done.append, 1)
    recorder.flush()
    assert done == [1]


def test_a_full_queue_drops_and_counts_instead_of_blocking():
    recorder = BackgroundRecorder(max_pending=2)
    release, started = threading.Event(), threading.Event()
    done: list[int] = []
    recorder.submit(lambda: (started.set(), release.wait(10)))
    assert started.wait(10)  # the thread is busy; the queue is empty again
    for i in range(5):
        recorder.submit(done.append, i)  # 2 fit, 3 are dropped, none blocks
    assert recorder.dropped == 3
    release.set()
    recorder.flush()
    assert done == [0, 1]

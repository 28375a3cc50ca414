"""batchsim.sim.handover: the worker hand-over the core's thread, the ITL read-ahead and the
Parquet writer share (the interrupt tests in test_core and test_itl drive it with alarms)."""

from __future__ import annotations

import time

from batchsim.sim.handover import Handover


def test_a_worker_stopped_before_it_began_runs_nothing():
    ran = []
    h = Handover()
    assert h.halt() is False  # (as where an interrupt cut the start short: stop set, nothing begun)
    h.start(ran.append, 1)  # (a launch that still happens runs nothing of the function)
    h.wait()
    assert h.began and h.done and ran == []


def test_a_worker_that_began_is_waited_for_until_done():
    seen = []
    h = Handover()

    def work():
        while not h.stop:
            time.sleep(0.001)
        time.sleep(0.02)  # (its last touch of the owner's state, after the stop)
        seen.append("last")

    h.start(work)
    while not h.began:
        time.sleep(0.001)
    assert h.halt() is True
    h.wait()
    assert h.done and seen == ["last"]


def test_waiting_on_a_worker_never_launched_returns():
    h = Handover()  # (an interrupt before the launch: neither launched nor begun)
    h.halt()
    h.wait()
    assert not h.done


def test_waiting_on_the_worker_from_its_own_thread_returns():
    """The owner's cleanup can run on the worker's thread (a garbage collection there closing an
    unclosed read-ahead): waiting for itself would never end."""
    h = Handover()
    h.start(lambda: (h.halt(), h.wait()))
    deadline = time.monotonic() + 5
    while not h.done and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h.done

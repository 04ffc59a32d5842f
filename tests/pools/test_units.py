"""The pool manager's parts on their own: tracker generations and idle stages,
debounced activity, key naming, the subprocess driver's restarts."""

from __future__ import annotations

import sys
import threading
import uuid

import pytest

from holdfast.pool.activity import ActivityReports
from holdfast.pool.drivers import SubprocessDriver, WorkerGroup
from holdfast.pool.tracker import KeyState, PoolTracker
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.poolnames import ACTIVITY_KEY, MAX_KEY_BYTES, PoolNames, check_key
from holdfast.sdk.types import Message
from tests.support.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_goes_active_unbound_stopped_with_a_generation_per_change() -> None:
    clock = Clock()
    tracker = PoolTracker(unbind_delay=10, stop_delay=5, clock=clock)
    assert tracker.activate("k") == 1
    assert tracker.activate("k") == 1  # already active: same generation
    clock.now += 9.9
    assert tracker.expire() == 0
    tracker.touch("k")  # activity postpones the unbind
    clock.now += 9.9
    assert tracker.expire() == 0
    clock.now += 0.2
    assert tracker.expire() == 1
    record = tracker.get("k")
    assert record is not None and (record.state, record.generation) == (KeyState.UNBOUND, 2)
    assert tracker.activate("k") == 3  # a request while unbound: active again
    clock.now += 10.5
    tracker.expire()
    clock.now += 5.5
    tracker.expire()
    record = tracker.get("k")
    assert record is not None and (record.state, record.generation) == (KeyState.STOPPED, 5)
    assert not tracker.forget("k", 4)  # a stale generation is not forgotten
    assert tracker.forget("k", 5) and tracker.get("k") is None


def test_wait_bound_waits_for_the_queue_loop_of_this_generation() -> None:
    tracker = PoolTracker(unbind_delay=10, stop_delay=5)
    generation = tracker.activate("k")
    assert not tracker.wait_bound("k", generation, 0.05)
    threading.Timer(0.05, tracker.converged, ("k", generation), {"queue": True}).start()
    assert tracker.wait_bound("k", generation, 5)


def test_activity_is_debounced_before_it_reaches_the_tracker() -> None:
    clock = Clock()
    tracker = PoolTracker(unbind_delay=10, stop_delay=5, clock=clock)
    reports = ActivityReports(tracker, debounce=1.0, clock=clock)
    settled: list[object] = []

    def report(key: str) -> Message:
        props = {ACTIVITY_KEY: key}
        return Message(
            uuid.uuid4(),
            b"",
            props,
            1,
            "hf://d/p.activity",
            lambda m, r=None: settled.append(r),
            1,
            1,
        )

    for _ in range(50):
        reports.on_message(report("k"))
    clock.now += 1.0
    reports.on_message(report("k"))
    reports.on_message(report(""))  # not a key: confirmed and dropped
    assert (reports.received, reports.passed) == (52, 2)
    assert len(settled) == 52 and set(settled) == {None}  # every report confirmed
    assert tracker.get("k") is not None  # an unknown key's activity adopts it


def test_keys_are_data_with_a_bound() -> None:
    names = PoolNames.of("hf://infra/sim")
    queue = names.key_queue("../../etc/passwd; rm -rf /")
    assert queue.startswith("hf://infra/sim.key-") and len(queue.rsplit("-", 1)[1]) == 32
    assert names.key_queue("a") != names.key_queue("b")
    assert check_key("é" * (MAX_KEY_BYTES // 2)) == "é" * (MAX_KEY_BYTES // 2)
    for bad in ("", "x" * (MAX_KEY_BYTES + 1), "a\0b", "\ud800", 42):
        with pytest.raises(InvalidArgumentError):
            check_key(bad)
    with pytest.raises(InvalidArgumentError, match="pool name"):
        PoolNames.of("hf://d/" + "p" * 100)


def test_the_subprocess_driver_restarts_a_dead_worker_after_a_back_off() -> None:
    driver = SubprocessDriver([sys.executable, "-c", "import sys; sys.exit(1)"], stop_grace=2)
    group = WorkerGroup("hf://d/p", "k", "p-1", "hf://d/p.key-x", "127.0.0.1:1")
    try:
        driver.ensure_running(group)
        assert driver.starts == 1
        wait_until(lambda: driver.pid(group) is None, 10, "the worker to exit")
        driver.ensure_running(group)  # noticed dead: restart scheduled, not yet
        assert driver.starts == 1

        def restarted() -> bool:
            driver.ensure_running(group)
            return driver.starts == 2

        wait_until(restarted, 5, "a restart")
    finally:
        driver.close()
    assert driver.pid(group) is None

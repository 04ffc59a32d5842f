"""The pool manager's parts on their own: tracker generations and idle stages,
debounced activity, key naming, the subprocess driver's restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import replace

import pytest

from holdfast.pool.activity import DEBOUNCE, ActivityReports
from holdfast.pool.drivers import SubprocessDriver, WorkerGroup, WorkerInfo
from holdfast.pool.reconcile import Reconciler
from holdfast.pool.supervisor import RESTART_INITIAL, VERDICT_DELAY, Supervisor
from holdfast.pool.tracker import KeyState, PoolTracker
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk.admin import PeekedMessage, QueueInfo
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.pool import unprefetched
from holdfast.sdk.poolnames import (
    ACTIVITY_KEY,
    MAX_KEY_BYTES,
    PROCESSING_TIMEOUT_EXIT,
    PoolNames,
    check_key,
)
from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.types import Message
from tests.support.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pool_worker_holds_only_the_requests_it_runs() -> None:
    # A held request counts a delivery at each crash of another: it would end in
    # the poison queue without ever having run (tests/pools/test_crashes.py).
    assert unprefetched(None).prefetch(4) == 0
    kept = unprefetched(WorkerOptions(reply_window=9.0, extra_requests=0))
    assert (kept.reply_window, kept.prefetch(1)) == (9.0, 0)
    with pytest.raises(InvalidArgumentError, match="extra_requests"):
        unprefetched(WorkerOptions(extra_requests=1))


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


@pytest.mark.parametrize(
    "name", ["sim.key-zz", "sim.key-", "a.key-b.c", "sim.orphans", "sim.poison", "x.manager"]
)
def test_a_pool_named_like_another_pool_s_queues_is_refused(name: str) -> None:
    """``hf://infra/sim.key-zz`` started without error beside pool ``sim``, whose key
    template matched its queues: its token was redirected to ``sim``'s orphans and
    its callers' requests expired."""
    with pytest.raises(InvalidArgumentError, match="names another pool's queues"):
        PoolNames.of(f"hf://infra/{name}")


def test_dots_elsewhere_in_a_pool_name_are_fine() -> None:
    for name in ("sim.v2", "keys", "sim.keyring", "orphans", "sim.orphans2"):
        assert PoolNames.of(f"hf://infra/{name}").pool == name


def test_a_debounced_activity_never_makes_an_idle_stage_shorter() -> None:
    clock = Clock()
    tracker = PoolTracker(1.0, 1.0, clock, activity_slack=DEBOUNCE)
    reports = ActivityReports(tracker, clock=clock)
    tracker.activate("k")
    clock.now += 0.1
    reports.on_message(_report("k"))  # passes: the tracker's last touch is 100.1
    clock.now += 0.8
    reports.on_message(_report("k"))  # debounced: the real last activity is 100.9
    clock.now = 100.9 + 0.99
    assert tracker.expire() == 0  # 0.99 s idle: not yet
    clock.now = 100.9 + 1.0 + DEBOUNCE - 0.8
    tracker.expire()
    assert tracker.get("k").state is KeyState.UNBOUND  # type: ignore[union-attr]


def _report(key: str) -> Message:
    return Message(
        uuid.uuid4(), b"", {ACTIVITY_KEY: key}, 1, "hf://d/p.activity", lambda m, r=None: None, 1, 1
    )


class FakeDriver:
    """A driver whose workers exit when the test says so."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        self.started: list[str] = []

    def start(self, group: WorkerGroup) -> WorkerInfo:
        info = WorkerInfo(group.worker_id, group.key, str(len(self.started)), 0.0)
        self.workers[group.worker_id] = info
        self.started.append(group.worker_id)
        return info

    def exit(self, worker_id: str, status: int, tail: str = "") -> None:
        self.workers[worker_id] = replace(
            self.workers[worker_id], exit_status=status, output_tail=tail
        )

    def stop(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)

    def list(self) -> list[WorkerInfo]:
        return list(self.workers.values())

    def adopt(self, worker: WorkerInfo) -> bool:
        return False

    def close(self) -> None:
        self.workers.clear()


GROUP = WorkerGroup("hf://d/p", "k", "p-1", "hf://d/p.key-x", "127.0.0.1:1")


def supervised() -> tuple[Supervisor, FakeDriver, Clock, list[str], list[str]]:
    driver, clock = FakeDriver(), Clock()
    failures: list[str] = []
    cleared: list[str] = []
    supervisor = Supervisor(
        driver,
        lambda group, text: failures.append(text),
        lambda group: cleared.append(group.key),
        clock,
    )
    return supervisor, driver, clock, failures, cleared


def test_a_worker_that_exits_before_it_is_ready_is_a_start_failure_with_its_reason() -> None:
    supervisor, driver, clock, failures, cleared = supervised()
    supervisor.ensure_running(GROUP)
    assert driver.started == ["p-1"] and cleared == ["k"]
    driver.exit("p-1", 4, "Traceback...\nboom: no config\n")
    supervisor.refresh()
    supervisor.ensure_running(GROUP)  # being judged: a late "started" may still come
    assert failures == [] and driver.started == ["p-1"]
    clock.now += VERDICT_DELAY
    supervisor.refresh()
    (text,) = failures
    assert "pool hf://d/p, key 'k'" in text and "status 4" in text and "boom: no config" in text
    assert supervisor.start_failures == 1
    supervisor.ensure_running(GROUP)  # backing off: not yet
    assert driver.started == ["p-1"]
    clock.now += RESTART_INITIAL
    supervisor.ensure_running(GROUP)
    assert driver.started == ["p-1", "p-1"] and cleared == ["k", "k"]
    driver.exit("p-1", 4)  # fails again: the back-off doubles
    supervisor.refresh()
    clock.now += VERDICT_DELAY
    supervisor.refresh()
    clock.now += RESTART_INITIAL
    supervisor.ensure_running(GROUP)
    assert len(driver.started) == 2
    clock.now += RESTART_INITIAL
    supervisor.ensure_running(GROUP)
    assert len(driver.started) == 3


def test_a_ready_worker_that_exits_is_a_crash_and_a_late_started_report_counts() -> None:
    supervisor, driver, clock, failures, _ = supervised()
    supervisor.ensure_running(GROUP)
    supervisor.ready("p-1")
    driver.exit("p-1", 3)
    supervisor.refresh()
    assert (supervisor.crashes, failures) == (1, [])
    clock.now += RESTART_INITIAL
    supervisor.ensure_running(GROUP)
    driver.exit("p-1", 3)
    supervisor.refresh()
    supervisor.ready("p-1")  # its report arrives after the exit was seen
    clock.now += VERDICT_DELAY
    supervisor.refresh()
    assert (supervisor.crashes, supervisor.start_failures, failures) == (2, 0, [])


def test_a_processing_timeout_replaces_the_worker_at_once_and_is_counted() -> None:
    supervisor, driver, _, failures, _ = supervised()
    supervisor.ensure_running(GROUP)
    supervisor.ready("p-1")
    driver.exit("p-1", PROCESSING_TIMEOUT_EXIT)
    supervisor.refresh()
    supervisor.ensure_running(GROUP)  # no back-off
    assert (supervisor.processing_timeouts, len(driver.started), failures) == (1, 2, [])


def test_groups_the_tracker_no_longer_has_are_stopped() -> None:
    supervisor, driver, _, _, _ = supervised()
    other = replace(GROUP, key="k2", worker_id="p-2")
    supervisor.ensure_running(GROUP)
    supervisor.ensure_running(other)
    supervisor.retain(["p-2"])
    assert list(driver.workers) == ["p-2"]
    supervisor.stop_all()
    assert driver.workers == {}


def test_the_subprocess_driver_reports_exit_status_and_stderr_tail() -> None:
    command = [sys.executable, "-c", "import sys; sys.stderr.write('no config\\n'); sys.exit(4)"]
    driver = SubprocessDriver(command, stop_grace=2)
    try:
        info = driver.start(GROUP)
        assert info.exit_status is None and int(info.handle) > 0

        def exited() -> bool:
            (listed,) = driver.list()
            return listed.exit_status is not None

        wait_until(exited, 10, "the worker to exit")
        (listed,) = driver.list()
        assert listed.exit_status == 4 and "no config" in listed.output_tail
    finally:
        driver.close()
    assert driver.list() == []


MANAGER = """
import sys, time
from holdfast.pool.drivers import SubprocessDriver, WorkerGroup, WorkerInfo
from holdfast.pool.reconcile import Reconciler
from holdfast.pool.supervisor import RESTART_INITIAL, VERDICT_DELAY, Supervisor
driver = SubprocessDriver([sys.executable, "-c", "import time; time.sleep(120)"])
info = driver.start(WorkerGroup("hf://d/p", "k", "p-1", "hf://d/p.key-x", "127.0.0.1:1"))
print(info.handle, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_subprocess_workers_die_with_a_manager_killed_with_sigkill() -> None:
    manager = subprocess.Popen(
        [sys.executable, "-c", MANAGER], stdout=subprocess.PIPE, start_new_session=True
    )
    worker = 0
    try:
        assert manager.stdout is not None
        worker = int(manager.stdout.readline())
        assert alive(worker)
        manager.send_signal(signal.SIGKILL)
        manager.wait(10)
        wait_until(lambda: not alive(worker), 10, "the worker to die with its manager")
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.wait(10)
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class FakeAdmin:
    """The admin calls reconciliation makes, over a dict of queues."""

    def __init__(self, queues: dict[str, tuple[int, bool, str | None]]) -> None:
        self.queues_ = queues  # uri -> (ready, bound, key of its requests)
        self.cleared: list[str] = []
        self.deleted: list[str] = []

    def queues(self) -> list[QueueInfo]:
        infos = []
        for uri, (ready, bound, _) in self.queues_.items():
            policy = QueuePolicy(redirect=None if bound else "hf://d/p.orphans")
            infos.append(QueueInfo(uri, ready, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0, policy))
        return infos

    def peek(self, uri: str, count: int = 10) -> list[PeekedMessage]:
        key = self.queues_[uri][2]
        return [PeekedMessage(b"g" * 16, b"", {"x-rpc-key": key} if key else {}, 1, 0.0)]

    def set_policy(self, uri: str, policy: QueuePolicy) -> QueuePolicy:
        self.cleared.append(uri)
        return policy

    def delete(self, uri: str) -> int:
        self.deleted.append(uri)
        return 0


def test_reconciliation_activates_keys_with_waiting_requests_and_unbinds_empty_queues() -> None:
    names = PoolNames.of("hf://d/p")
    waiting, empty, stray = names.key_queue("k1"), names.key_queue("k2"), names.key_queue("k3")
    admin = FakeAdmin(
        {
            waiting: (2, True, "k1"),
            empty: (0, True, None),
            stray: (1, True, "not-k3"),  # a request whose key does not name the queue
            "hf://d/p.orphans": (5, True, "k9"),  # not a key queue
            names.key_queue("k4"): (0, False, None),  # unbound already: left alone
        }
    )
    tracker = PoolTracker(1, 1, Clock())
    reconciler = Reconciler(tracker, admin, names)  # type: ignore[arg-type]
    reconciler.run()
    assert [r.key for r in tracker.snapshot()] == ["k1"]
    assert (admin.cleared, admin.deleted) == ([empty], [empty])
    assert (reconciler.activated, reconciler.unbound) == (1, 1)
    reconciler.run()  # k1 is tracked now: nothing more to do
    assert reconciler.activated == 1

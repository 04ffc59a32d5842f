"""Keyed worker pools on a bad day (issue #31, osrdyne's crash rows): a manager
killed with SIGKILL and restarted, a lost host (manager and worker killed) replaced
by a new manager, a worker that stalls, a worker that cannot start."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from holdfast.sdk import DeadLetteredError, Session, WorkerStartError
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.poolnames import PoolNames
from tests.pools.support import alive, manager_command, running_manager, start_manager, stop, who
from tests.pools.worker_main import RUNS
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

POOL = "hf://infra/crash"


def test_a_manager_killed_with_sigkill_takes_its_workers_and_a_new_one_serves(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    command = manager_command(broker.address, POOL)
    first = start_manager(command, tmp_path / "first.log")
    pids: list[int] = []
    second = None
    try:
        with Session(broker.address, options=FAST) as session:
            served = who(session.request(POOL, b"a", key="1", timeout=60))
            pids.append(served[2])
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            wait_until(lambda: not alive(served[2]), 10, "the worker to die with its manager")
            second = start_manager(command, tmp_path / "second.log")
            again = who(session.request(POOL, b"b", key="1", timeout=60))
            pids.append(again[2])
            assert again[3] == b"b" and again[2] != served[2]
            # One worker for the key: a second request is served by the same process.
            assert who(session.request(POOL, b"c", key="1", timeout=30))[2] == again[2]
    finally:
        for process in (first, second):
            if process is not None:
                stop(process)
        _kill(pids)


def test_a_new_manager_serves_requests_left_in_the_bound_queue_of_a_lost_host(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    names = PoolNames.of(POOL)
    command = manager_command(broker.address, POOL)
    lost = start_manager(command, tmp_path / "lost.log")
    pids: list[int] = []
    replacement = None
    try:
        with Session(broker.address, options=FAST) as session, AdminClient(broker.address) as admin:
            pids.append(who(session.request(POOL, b"a", key="7", timeout=60))[2])
            lost.send_signal(signal.SIGKILL)  # the manager, and its worker with it
            lost.wait(10)
            wait_until(lambda: not alive(pids[0]), 10, "the worker to die")
            # The key's queue is still bound: the next request waits there, unserved.
            pending = session.request_async(POOL, b"b", key="7", timeout=60)
            queue = names.key_queue("7")
            # (It may not wait alone: the worker's confirm of "a" can die with it.)
            wait_until(lambda: admin.stats(queue).ready >= 1, 10, "the request to wait")
            replacement = start_manager(command, tmp_path / "replacement.log")
            served = who(pending.result(60))
            pids.append(served[2])
            assert served[3] == b"b"
            # Reconciliation found the waiting request, unless the lost worker's last
            # activity reports (still in the activity queue) named its key first.
    finally:
        for process in (lost, replacement):
            if process is not None:
                stop(process)
        _kill(pids)


def test_a_stalled_worker_is_replaced_after_the_processing_timeout(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "stalled"
    with (
        running_manager(broker.address, POOL, processing_timeout=1.5) as manager,
        Session(broker.address, options=FAST) as session,
    ):
        reply = who(session.request(POOL, f"stall-once:{marker}".encode(), key="s", timeout=60))
        stalled = int(marker.read_text())
        assert reply[2] != stalled  # served by the worker that replaced the stalled one
        assert not alive(stalled)
        assert manager.supervisor.processing_timeouts == 1
        assert who(session.request(POOL, b"next", key="s", timeout=30))[2] == reply[2]


def test_a_worker_that_cannot_start_fails_its_caller_fast_with_the_reason(
    broker: BrokerProcess,
) -> None:
    command = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('boom: WORKER_CONFIG is not set\\n'); sys.exit(4)",
    ]
    with (
        running_manager(broker.address, POOL, command) as manager,
        Session(broker.address, options=FAST) as session,
    ):
        began = time.monotonic()
        with pytest.raises(WorkerStartError) as caught:
            session.request(POOL, b"x", key="k1", timeout=60)
        elapsed = time.monotonic() - began
        assert elapsed < 5, f"the caller waited {elapsed:.1f} s"
        error = caught.value
        assert (error.pool, error.key) == (POOL, "k1")
        assert "status 4" in str(error) and "WORKER_CONFIG is not set" in str(error)
        assert manager.supervisor.start_failures >= 1
        # (Counted on the error reply's ACK, which may reach the manager after the caller.)
        wait_until(lambda: manager.start_failures.failed_calls >= 1, 10, "the count")


def test_a_poison_request_takes_neither_the_request_before_it_nor_the_one_after(
    broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside tester, t18: a request that finished just before a poison one on its key
    went to the poison queue with it, its handler run --max-deliveries times (its
    CONFIRM waits for its reply's ACK, and the crash came first); one held behind a
    poison request went back, its delivery count risen, at each crash."""
    runs = tmp_path / "runs"
    monkeypatch.setenv(RUNS, str(runs))  # the manager's workers inherit it
    names = PoolNames.of(POOL)
    with (
        running_manager(broker.address, POOL, max_deliveries=3),
        Session(broker.address, options=FAST) as session,
        AdminClient(broker.address) as admin,
    ):
        outcomes: list[tuple[bytes, str]] = []
        # A key each: its restart back-off doubles with each crash of the key.
        for key, round_ in (("n", [b"nap", b"crash", b"after"]), ("m", [b"crash", b"behind"])):
            assert who(session.request(POOL, b"warm", key=key, timeout=60))[3] == b"warm"
            calls = [session.request_async(POOL, p, key=key, timeout=60) for p in round_]
            for payload, call in zip(round_, calls, strict=True):
                try:
                    outcomes.append((payload, who(call.result(60))[3].decode()))
                except DeadLetteredError as error:
                    outcomes.append((payload, f"dead-lettered {error.reason}"))
        assert outcomes == [
            (b"nap", "nap"),
            (b"crash", "dead-lettered delivery-limit"),
            (b"after", "after"),
            (b"crash", "dead-lettered delivery-limit"),
            (b"behind", "behind"),
        ]
        assert [letter.payload for letter in admin.peek(names.poison)] == [b"crash", b"crash"]
        handled = [line.split(" ", 2) for line in runs.read_text().splitlines()]
        innocent = [(count, payload) for _, count, payload in handled if payload != "crash"]
        # Each run once, at its first delivery: no crash counted against it.
        assert innocent == [("1", p) for p in ("warm", "nap", "after", "warm", "behind")]


def _kill(pids: list[int]) -> None:
    """SIGKILL the workers the test saw that still run (only after a failure)."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

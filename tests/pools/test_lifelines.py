"""Workers never outlive their manager, and a frozen one is replaced (issue #31):
a worker command that is a wrapper script (its Python worker a grandchild of the
manager) through a manager's ``kill -9`` and its graceful stop; a worker frozen
whole (SIGSTOP) under ``--processing-timeout``; the supervisor's verdict on silence."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from holdfast.pool.supervisor import Supervisor
from holdfast.sdk import Session
from holdfast.sdk.poolnames import alive_interval
from tests.pools.support import alive, manager_command, running_manager, start_manager, stop, who
from tests.pools.test_units import GROUP, Clock, FakeDriver
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, Linux"),
]

POOL = "hf://infra/lifeline"


def _wrapper(tmp_path: Path) -> list[str]:
    """A worker command that is a shell script running the test worker without
    ``exec``: the worker is the manager's grandchild."""
    script = tmp_path / "wrap.sh"
    script.write_text(
        f"echo wrapper $$ >&2\n{sys.executable} -m tests.pools.worker_main\necho done >&2\n"
    )
    return ["sh", str(script)]


def _kill(pids: list[int]) -> None:
    """SIGKILL the workers the test saw that still run (only after a failure)."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_wrapped_worker_dies_with_a_manager_killed_with_sigkill_and_is_never_doubled(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    wrapper = " ".join(_wrapper(tmp_path))
    command = [*manager_command(broker.address, POOL)[:-2], "--worker-command", wrapper]
    first = start_manager(command, tmp_path / "first.log")
    pids: list[int] = []
    second = None
    try:
        with Session(broker.address, options=FAST) as session:
            served = who(session.request(POOL, b"a", key="1", timeout=60))
            pids.append(served[2])
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            # The parent-death signal ends the shell; the lifeline pipe, the worker.
            wait_until(lambda: not alive(served[2]), 10, "the wrapped worker to die")
            second = start_manager(command, tmp_path / "second.log")
            replies = [who(session.request(POOL, b"b", key="1", timeout=60)) for _ in range(5)]
            pids.extend(reply[2] for reply in replies)
            assert {reply[2] for reply in replies} == {replies[0][2]} != {served[2]}
            stop(second)  # a graceful stop reaches the wrapper's child too
            wait_until(lambda: not alive(replies[0][2]), 15, "the second worker to stop")
    finally:
        for process in (first, second):
            if process is not None:
                stop(process)
        _kill(pids)


def test_stopping_a_manager_stops_the_whole_process_group_of_a_wrapped_worker(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    pids: list[int] = []
    try:
        with (
            running_manager(broker.address, POOL, _wrapper(tmp_path)),
            Session(broker.address, options=FAST) as session,
        ):
            pids.append(who(session.request(POOL, b"a", key="g", timeout=60))[2])
        wait_until(lambda: not alive(pids[0]), 10, "the wrapped worker to stop with its manager")
    finally:
        _kill(pids)


def test_a_frozen_worker_is_killed_and_replaced_after_the_processing_timeout(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "holdfast.pool.supervisor")
    pids: list[int] = []
    try:
        with (
            running_manager(broker.address, POOL, processing_timeout=1.5) as manager,
            Session(broker.address, options=FAST) as session,
        ):
            first = who(session.request(POOL, b"a", key="f", timeout=60))[2]
            pids.append(first)
            # Idle for twice the timeout: its alive reports keep it (and only them).
            time.sleep(3.5)
            assert who(session.request(POOL, b"b", key="f", timeout=30))[2] == first
            os.kill(first, signal.SIGSTOP)
            served = who(session.request(POOL, b"c", key="f", timeout=30))
            pids.append(served[2])
            assert served[2] != first and served[3] == b"c"
            wait_until(lambda: not alive(first), 10, "the frozen worker to be killed")
            assert manager.supervisor.frozen == 1
            frozen = [r for r in caplog.records if "frozen" in r.getMessage()]
            assert len(frozen) == 1 and frozen[0].levelno == logging.WARNING
    finally:
        _kill(pids)


def test_silence_while_the_managers_link_is_down_does_not_count() -> None:
    driver, clock, linked = FakeDriver(), Clock(), [True]
    supervisor = Supervisor(
        driver, lambda *_: None, lambda _: None, clock, frozen_after=2.0, linked=lambda: linked[0]
    )
    supervisor.ensure_running(GROUP)
    supervisor.ready(GROUP.worker_id, alive_interval(2.0))
    clock.now += 2.4
    supervisor.seen(GROUP.worker_id)  # an ALIVE report
    clock.now += 2.4  # under the timeout plus one interval since the report
    supervisor.refresh()
    linked[0] = False
    clock.now += 10  # no report can arrive: not a verdict
    supervisor.refresh()
    linked[0] = True
    clock.now += 2.4
    supervisor.refresh()
    assert (supervisor.frozen, driver.started) == (0, [GROUP.worker_id])
    clock.now += 0.2  # 2.6 s of silence with a link: past 2 s plus 0.5 s
    supervisor.refresh()
    assert supervisor.frozen == 1 and GROUP.worker_id not in driver.workers
    supervisor.ensure_running(GROUP)  # replaced at once, no back-off
    assert driver.started == [GROUP.worker_id] * 2

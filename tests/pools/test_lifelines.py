"""Workers never outlive their manager (issue #31): a worker command that is a
wrapper script (its Python worker a grandchild of the manager) through a manager's
``kill -9`` and its graceful stop."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from holdfast.sdk import Session
from tests.pools.support import alive, manager_command, running_manager, start_manager, stop, who
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

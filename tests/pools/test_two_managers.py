"""Two managers of one pool in one process: only the active one takes the workers'
activity reports (a standby that took some made the active one judge a worker that
crashed on a request as one that never started, and let keys go idle early), and a
manager that stops stops its workers before it gives the token up, so the next one
never runs a second worker beside them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from holdfast.pool.drivers import SubprocessDriver
from holdfast.pool.manager import PoolManager
from holdfast.sdk import Session
from tests.pools.support import alive, running_manager, who
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

POOL = "hf://infra/pair"
KEYS = ("1", "2", "3")


@contextlib.contextmanager
def two_managers(address: str) -> Iterator[tuple[PoolManager, PoolManager]]:
    """Two started managers of ``POOL``; (active, standby) once one holds the token."""
    with running_manager(address, POOL) as first, running_manager(address, POOL) as second:
        wait_until(lambda: first.leadership.active or second.leadership.active, 30, "a leader")
        yield (first, second) if first.leadership.active else (second, first)


def test_only_the_active_manager_takes_activity_reports(broker: BrokerProcess) -> None:
    with (
        two_managers(broker.address) as (active, standby),
        Session(broker.address, options=FAST) as s,
    ):
        for round_ in range(3):
            for key in KEYS:
                assert who(s.request(POOL, b"%d" % round_, key=key, timeout=60))[0] == key
        wait_until(lambda: active.activity.received >= len(KEYS), 10, "the started reports")
        assert standby.activity.received == 0


def test_a_stopping_manager_stops_its_workers_before_the_next_one_takes_over(
    broker: BrokerProcess,
) -> None:
    with (
        two_managers(broker.address) as (active, standby),
        Session(broker.address, options=FAST) as s,
    ):
        pids = [who(s.request(POOL, b"x", key=key, timeout=60))[2] for key in KEYS]
        driver = active.driver
        assert isinstance(driver, SubprocessDriver)
        stopping = threading.Thread(target=active.stop)
        stopping.start()
        wait_until(lambda: standby.leadership.active, 30, "the standby to take over")
        still = [pid for pid in pids if alive(pid)]
        stopping.join(30)
        assert still == []  # none of the old workers ran when the new manager could act
        for key in KEYS:  # and the new one serves every key
            assert who(s.request(POOL, b"y", key=key, timeout=60))[2] not in pids

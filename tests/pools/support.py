"""Helpers of the pool tests: a manager in-process with the subprocess driver."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from holdfast.pool.drivers import SubprocessDriver
from holdfast.pool.manager import PoolManager, PoolSettings
from holdfast.sdk import Reply

WORKER = [sys.executable, "-m", "tests.pools.worker_main"]


@contextmanager
def running_manager(address: str, pool: str, **settings: float) -> Iterator[PoolManager]:
    """A started pool manager whose workers are ``tests.pools.worker_main`` processes;
    stopped (with every worker it started, by PID) on exit."""
    manager = PoolManager(
        PoolSettings(address=address, admin_address=address, pool=pool, **settings),  # type: ignore[arg-type]
        SubprocessDriver(WORKER, stop_grace=5.0),
    )
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


def who(reply: Reply) -> tuple[str, str, int, bytes]:
    """(key, worker id, pid, payload) of a ``worker_main`` reply."""
    key, worker, pid, payload = reply.payload.split(b"|", 3)
    return key.decode(), worker.decode(), int(pid), payload

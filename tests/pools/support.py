"""Helpers of the pool tests: a manager in-process with the subprocess driver."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from holdfast.pool.drivers import SubprocessDriver
from holdfast.pool.manager import PoolManager, PoolSettings
from holdfast.sdk import Reply
from tests.support.waiting import wait_until

WORKER = [sys.executable, "-m", "tests.pools.worker_main"]


@contextmanager
def running_manager(
    address: str, pool: str, command: list[str] | None = None, **settings: float
) -> Iterator[PoolManager]:
    """A started pool manager whose workers run ``command`` (by default
    ``tests.pools.worker_main``); stopped (with every worker it started, by PID) on
    exit."""
    manager = PoolManager(
        PoolSettings(address=address, admin_address=address, pool=pool, **settings),  # type: ignore[arg-type]
        SubprocessDriver(command or WORKER, stop_grace=5.0),
    )
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited and not reaped yet, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_manager(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``holdfast-pool`` logging to ``log``; return once it manages the pool."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stderr=sink, start_new_session=True)
    wait_until(lambda: b"managing pool" in log.read_bytes(), 30, f"{log.name} to start")
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process`` (by PID), SIGKILL it if it does not end in 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def manager_command(address: str, pool: str, *extra: str) -> list[str]:
    """The ``holdfast-pool`` command line of a manager of ``pool`` with test workers."""
    return [
        sys.executable, "-m", "holdfast.pool", "--address", address, "--pool", pool,
        "--worker-command", " ".join(WORKER), *extra,
    ]  # fmt: skip


def who(reply: Reply) -> tuple[str, str, int, bytes]:
    """(key, worker id, pid, payload) of a ``worker_main`` reply."""
    key, worker, pid, payload = reply.payload.split(b"|", 3)
    return key.decode(), worker.decode(), int(pid), payload

"""Worker and caller subprocesses for request/reply tests (started and killed by PID),
and an asyncio worker and caller in this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

from holdfast.sdk import Request, aio
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class ChildProcess:
    """``python -m MODULE ARGS...`` that prints ``ready_line`` when it is ready (with
    ``ready_line=None``, any first line, kept as ``first_line``)."""

    def __init__(self, module: str, args: list[str], ready_line: str | None) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # "" if it dies; bounded by pytest-timeout
        self.first_line = line.strip()
        if not line or (ready_line is not None and self.first_line != ready_line):
            self.kill()
            raise RuntimeError(f"{module} did not start: {line[:200]!r}")

    @property
    def pid(self) -> int:
        """The process id."""
        return self._proc.pid

    def kill(self) -> None:
        """SIGKILL the process (by PID) and reap it."""
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


def worker_process(
    address: str, uri: str, log: Path, sleep: float = 0.0, *, aio: bool = False
) -> ChildProcess:
    """A ``tests.rpc.worker_main`` worker (the asyncio one with ``aio``); its handler
    runs are logged to ``log``."""
    args = [address, uri, str(log), "--sleep", str(sleep), *(["--aio"] if aio else [])]
    return ChildProcess("tests.rpc.worker_main", args, "ready")


def caller_process(address: str, uri: str, *, aio: bool = False) -> ChildProcess:
    """A ``tests.rpc.caller_main`` caller (the asyncio one with ``aio``), waiting on
    one call."""
    args = [address, uri, *(["--aio"] if aio else [])]
    return ChildProcess("tests.rpc.caller_main", args, "calling")


def starts(log: Path) -> list[tuple[str, int]]:
    """``(request guid, pid)`` of every handler run logged so far."""
    if not log.exists():
        return []
    runs = []
    for line in log.read_text().splitlines():
        _, guid, pid = line.split()
        runs.append((guid, int(pid)))
    return runs


def wait_for_starts(log: Path, count: int, timeout: float = 20.0) -> list[tuple[str, int]]:
    """Wait until the log shows ``count`` handler runs; return them."""
    wait_until(lambda: len(starts(log)) >= count, timeout, f"{count} handler run(s)")
    return starts(log)


@asynccontextmanager
async def aio_worker_and_caller(
    address: str, uri: str, handle: Callable[[Request], Awaitable[bytes]]
) -> AsyncIterator[aio.Session]:
    """An asyncio ``Worker`` serving ``uri`` with ``handle`` on a session of its own, and
    a caller's session (yielded), both to ``address``."""
    async with (
        aio.Session(address, options=FAST) as worker_session,
        aio.Worker(worker_session, uri, handle),
        aio.Session(address, options=FAST) as caller,
    ):
        yield caller

"""How a pool's workers run: the driver interface, and the ``noop`` and
``subprocess`` drivers.

A *worker group* serves one key. A driver knows how to start, stop, list and adopt
workers, and nothing else: when to start, restart, back off or stop is the
manager's (``holdfast.pool.supervisor``), so a third-party driver (containers, a
cluster scheduler) implements these five methods and gets the manager's whole
behaviour:

- ``start(group) -> WorkerInfo``: start one worker of ``group`` with
  ``group.environment()`` added to its environment;
- ``stop(worker_id)``: stop it (SIGTERM then SIGKILL, or the platform's equivalent)
  and forget it; idempotent;
- ``list() -> list[WorkerInfo]``: every worker of this pool the driver can see,
  running or exited (``exit_status`` set, with the tail of its output), including
  workers an earlier manager started if they can outlive it;
- ``adopt(worker) -> bool``: take over a listed worker this manager did not start
  (an earlier manager's), so ``stop`` and ``close`` cover it; False if it cannot,
  and the manager then asks ``stop`` for it;
- ``close()``: stop every worker the driver started or adopted.

Each worker finds in its environment ``WORKER_ID``, ``WORKER_KEY``, ``WORKER_POOL``,
``WORKER_REQUESTS_QUEUE`` and ``HOLDFAST_ADDRESS`` (and ``WORKER_PROCESSING_TIMEOUT``
when the pool has one); ``holdfast.sdk.pool.serve`` reads them.

A driver may also have ``kill(worker_id)``: stop it at once, without a grace (the
supervisor uses it for a worker it judged frozen; ``stop`` without it).

The ``subprocess`` driver's workers never outlive their manager. Each is started in
a process group of its own through ``holdfast.pool.lifeline``, which sets the
parent-death signal (Linux ``PR_SET_PDEATHSIG``, SIGKILL) and execs the worker
command, from one thread that lives as long as the driver. That signal reaches the
process the manager started, not its children (a worker command that is a shell
script running Python without ``exec``), so each worker also gets the read end of a
*lifeline pipe* whose write end only the manager holds, named by
``WORKER_LIFELINE_FD``: ``serve`` ends the worker when it reads end-of-file there,
which the kernel gives as soon as the manager is gone, however it died. ``stop``
and ``close`` signal the worker's whole process group. So a manager killed with
SIGKILL takes its workers with it and a restarted manager never finds a second
worker for a key; its ``list`` therefore shows only its own children. A worker
command must not move its worker out of its process group (``setsid``, a daemon's
double fork), and a worker that does not use ``serve`` must ``exec`` its last step
or watch the lifeline itself.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Protocol

from holdfast.sdk.poolnames import LIFELINE_FD

log = logging.getLogger(__name__)

STOP_GRACE = 10.0
"""Seconds a worker gets after SIGTERM before SIGKILL."""

OUTPUT_TAIL_LINES = 20
"""Lines of a worker's stderr kept for the error that reports its failure."""


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """The worker group of one key."""

    pool: str
    """The pool URI, ``hf://<domain>/<pool>``."""
    key: str
    worker_id: str
    requests_queue: str
    address: str
    """Where workers connect (``HOLDFAST_ADDRESS``)."""
    tls_ca: str | None = None
    """The CA workers trust for TLS (``HOLDFAST_TLS_CA``), if any."""
    processing_timeout: float | None = None
    """Seconds a worker may spend on one request (``WORKER_PROCESSING_TIMEOUT``)."""

    def environment(self) -> dict[str, str]:
        """What a worker of this group finds in its environment."""
        extra = {"HOLDFAST_TLS_CA": self.tls_ca} if self.tls_ca else {}
        if self.processing_timeout is not None:
            extra["WORKER_PROCESSING_TIMEOUT"] = repr(self.processing_timeout)
        return {
            **extra,
            "WORKER_ID": self.worker_id,
            "WORKER_KEY": self.key,
            "WORKER_POOL": self.pool,
            "WORKER_REQUESTS_QUEUE": self.requests_queue,
            "HOLDFAST_ADDRESS": self.address,
        }


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as its driver sees it."""

    worker_id: str
    key: str
    handle: str
    """The driver's name for it: a PID, a container id."""
    started_at: float
    """Wall-clock seconds since the epoch when it was started."""
    exit_status: int | None = None
    """None while it runs; its exit status (negative: killed by that signal) after."""
    output_tail: str = ""
    """The last lines of its stderr (filled once it exited)."""


class WorkerGroupDriver(Protocol):
    """Starts, stops, lists and adopts workers (see the module docstring)."""

    def start(self, group: WorkerGroup) -> WorkerInfo:
        """Start one worker of ``group``."""
        ...

    def stop(self, worker_id: str) -> None:
        """Stop the worker ``worker_id`` if it runs, and forget it; idempotent."""
        ...

    def list(self) -> list[WorkerInfo]:
        """Every worker of the pool the driver can see, running or exited."""
        ...

    def adopt(self, worker: WorkerInfo) -> bool:
        """Take over a listed worker an earlier manager started; False if it cannot."""
        ...

    def close(self) -> None:
        """Stop every worker this driver started or adopted."""
        ...


class NoopDriver:
    """Workers are started by hand (or by another system): nothing to do, and
    nothing to see."""

    def start(self, group: WorkerGroup) -> WorkerInfo:
        """Nothing is started: the operator runs the group's workers."""
        return WorkerInfo(group.worker_id, group.key, "external", time.time())

    def stop(self, worker_id: str) -> None:
        """Nothing: the operator stops them."""

    def list(self) -> list[WorkerInfo]:
        """Nothing this driver can see."""
        return []

    def adopt(self, worker: WorkerInfo) -> bool:
        """Workers run by hand are the operator's: nothing to take over."""
        return False

    def close(self) -> None:
        """Nothing was started."""


@dataclass(slots=True)
class _Child:
    group: WorkerGroup
    popen: subprocess.Popen[bytes]
    started_at: float
    tail: collections.deque[str]
    reader: threading.Thread

    def info(self) -> WorkerInfo:
        status = self.popen.poll()
        if status is not None:
            self.reader.join(1.0)  # the pipe is at EOF once the process is gone
        return WorkerInfo(
            self.group.worker_id,
            self.group.key,
            str(self.popen.pid),
            self.started_at,
            status,
            "".join(self.tail) if status is not None else "",
        )


class SubprocessDriver:
    """One worker process per group: ``command`` (an argument list, never a shell
    line) with the group's environment added to the manager's. The worker's stderr
    passes through to the manager's, and its last lines are kept for errors."""

    def __init__(self, command: list[str], stop_grace: float = STOP_GRACE) -> None:
        if not command:
            raise ValueError("the subprocess driver needs a worker command")
        self.command = list(command)
        self.stop_grace = stop_grace
        self._children: dict[str, _Child] = {}
        self._lock = threading.Lock()
        # Both ends close-on-exec: only the workers get the read end (``pass_fds``),
        # so the manager alone holds the write end, and its death is the pipe's EOF.
        self._lifeline, write_end = os.pipe()
        self._pipe: tuple[int, ...] = (self._lifeline, write_end)
        # One long-lived thread forks every worker: the parent-death signal fires
        # when the *thread* that forked a child ends, not only the process.
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, "holdfast-pool-spawner")

    def start(self, group: WorkerGroup) -> WorkerInfo:
        """Start a worker process for ``group`` (stopping one that still runs)."""
        self.stop(group.worker_id)
        child = self._spawner.submit(self._spawn, group).result()
        with self._lock:
            self._children[group.worker_id] = child
        log.info(
            "started worker %s (key %r), pid %d", group.worker_id, group.key[:64], child.popen.pid
        )
        return child.info()

    def _spawn(self, group: WorkerGroup) -> _Child:
        lifeline = [sys.executable, "-m", "holdfast.pool.lifeline", str(os.getpid())]
        popen = subprocess.Popen(
            [*lifeline, *self.command],
            env={**os.environ, **group.environment(), LIFELINE_FD: str(self._lifeline)},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(self._lifeline,),
            start_new_session=True,  # its own process group: signals stay ours to send
        )
        tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        assert popen.stderr is not None
        reader = threading.Thread(
            target=_pass_through,
            args=(popen.stderr, tail),
            name=f"holdfast-pool-stderr-{popen.pid}",
            daemon=True,
        )
        reader.start()
        return _Child(group, popen, time.time(), tail, reader)

    def stop(self, worker_id: str) -> None:
        """SIGTERM the worker's process group, SIGKILL it after ``stop_grace``."""
        with self._lock:
            child = self._children.pop(worker_id, None)
        if child is not None:
            _terminate(child.popen, self.stop_grace)
            log.info("stopped worker %s (key %r)", worker_id, child.group.key[:64])

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker's process group now (a frozen worker cannot act on
        SIGTERM), and forget it."""
        with self._lock:
            child = self._children.pop(worker_id, None)
        if child is not None:
            _terminate(child.popen, 0.0)

    def list(self) -> list[WorkerInfo]:
        """This driver's children (none outlive their manager), running or exited."""
        with self._lock:
            children = list(self._children.values())
        return [child.info() for child in children]

    def adopt(self, worker: WorkerInfo) -> bool:
        """Only this driver's own children can be listed, and they are its already."""
        with self._lock:
            return worker.worker_id in self._children

    def pid(self, worker_id: str) -> int | None:
        """The running worker's PID, if any."""
        with self._lock:
            child = self._children.get(worker_id)
        if child is None or child.popen.poll() is not None:
            return None
        return child.popen.pid

    def close(self) -> None:
        """Stop every worker this driver started, all at once (SIGTERM to each, then one
        ``stop_grace`` for all of them), then its spawning thread."""
        with self._lock:
            children = list(self._children.values())
            self._children.clear()
        for child in children:
            _signal_group(child.popen, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        for child in children:
            _terminate(child.popen, max(0.0, deadline - time.monotonic()))
            log.info("stopped worker %s (key %r)", child.group.worker_id, child.group.key[:64])
        self._spawner.shutdown(wait=True)
        with self._lock:  # once: a number closed twice may be another file's by then
            pipe, self._pipe = self._pipe, ()
        for fd in pipe:
            os.close(fd)


def _pass_through(stream: IO[bytes], tail: collections.deque[str]) -> None:
    """Copy a worker's stderr to ours line by line, keeping the last lines."""
    with contextlib.suppress(OSError, ValueError):
        for line in iter(stream.readline, b""):
            text = line.decode("utf-8", "replace")
            tail.append(text)
            sys.stderr.write(text)
    with contextlib.suppress(OSError):
        stream.close()


def _signal_group(popen: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the worker's process group (its PID: ``start_new_session``), so that
    the children of a worker command that is a wrapper get it too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed its user: still there
        return True
    return True


def _terminate(popen: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the worker's process group; SIGKILL what is left of it after ``grace``
    (at once with 0). The worker is reaped first: while a member of its group lives,
    the group's number (the worker's PID) cannot be given to another process, so the
    later signals reach only the workers' own processes."""
    deadline = time.monotonic() + grace
    if grace > 0:
        _signal_group(popen, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(grace)
        while _group_alive(popen.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # a wrapper's children finishing their own stop
    if popen.poll() is None or _group_alive(popen.pid):
        _signal_group(popen, signal.SIGKILL)
    popen.wait(STOP_GRACE)  # SIGKILL cannot be ignored: this is the kernel's time


DRIVERS = ("subprocess", "noop")
"""``--driver`` values."""

__all__ = [
    "DRIVERS",
    "NoopDriver",
    "SubprocessDriver",
    "WorkerGroup",
    "WorkerGroupDriver",
    "WorkerInfo",
]

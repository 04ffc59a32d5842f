"""How a pool's worker groups run: the driver interface and two drivers.

A *worker group* serves one key. A driver is asked, on every tick of the group loop,
to keep the groups of the ACTIVE and UNBOUND keys running (``ensure_running``: start
one that is not running, restart one that died, with back-off) and to stop the groups
of STOPPED keys once their queue is empty (``stop``). Each worker finds in its
environment ``WORKER_ID``, ``WORKER_KEY``, ``WORKER_POOL`` (the pool URI),
``WORKER_REQUESTS_QUEUE`` and ``HOLDFAST_ADDRESS``; ``holdfast.sdk.pool.serve`` reads
them.

A docker or Kubernetes driver implements the same three methods: ``ensure_running``
creates the container (or scales a Deployment named after the group's
``worker_id`` to its replicas) with ``group.environment()`` if it does not exist,
``stop`` removes it, ``close`` stops what the driver started. They must be
idempotent: the loop calls them again on every tick and after a manager restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

STOP_GRACE = 10.0
"""Seconds a worker gets after SIGTERM before SIGKILL."""

RESTART_INITIAL = 0.5
RESTART_MAXIMUM = 30.0
"""Back-off, in seconds, before restarting a worker that died (doubling)."""


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

    def environment(self) -> dict[str, str]:
        """What a worker of this group finds in its environment."""
        tls = {"HOLDFAST_TLS_CA": self.tls_ca} if self.tls_ca else {}
        return {
            **tls,
            "WORKER_ID": self.worker_id,
            "WORKER_KEY": self.key,
            "WORKER_POOL": self.pool,
            "WORKER_REQUESTS_QUEUE": self.requests_queue,
            "HOLDFAST_ADDRESS": self.address,
        }


class WorkerGroupDriver(Protocol):
    """Starts and stops worker groups (see the module docstring)."""

    def ensure_running(self, group: WorkerGroup) -> None:
        """Make sure ``group`` runs (start, or restart after a crash with back-off)."""
        ...

    def stop(self, group: WorkerGroup) -> None:
        """Stop ``group`` if it runs; idempotent."""
        ...

    def close(self) -> None:
        """Stop every group this driver started."""
        ...


class NoopDriver:
    """Workers are started by hand (or by another system): nothing to do."""

    def ensure_running(self, group: WorkerGroup) -> None:
        """Nothing: the operator runs the group's workers."""

    def stop(self, group: WorkerGroup) -> None:
        """Nothing: the operator stops them."""

    def close(self) -> None:
        """Nothing was started."""


@dataclass(slots=True)
class _Process:
    popen: subprocess.Popen[bytes] | None
    failures: int = 0
    retry_at: float = 0.0


class SubprocessDriver:
    """One worker process per group: ``command`` (an argument list, never a shell
    line) with the group's environment added to the manager's."""

    def __init__(self, command: list[str], stop_grace: float = STOP_GRACE) -> None:
        if not command:
            raise ValueError("the subprocess driver needs a worker command")
        self.command = list(command)
        self.stop_grace = stop_grace
        self._processes: dict[str, _Process] = {}
        self.starts = 0
        """Worker processes started (restarts included)."""

    def pid(self, group: WorkerGroup) -> int | None:
        """The running worker's PID, if any."""
        process = self._processes.get(group.worker_id)
        if process is None or process.popen is None or process.popen.poll() is not None:
            return None
        return process.popen.pid

    def ensure_running(self, group: WorkerGroup) -> None:
        """Start the group's process unless it runs; restart a dead one after back-off."""
        process = self._processes.get(group.worker_id)
        now = time.monotonic()
        if process is not None and process.popen is not None:
            code = process.popen.poll()
            if code is None:
                return
            process.failures += 1
            delay = min(RESTART_INITIAL * 2 ** (process.failures - 1), RESTART_MAXIMUM)
            process.retry_at, process.popen = now + delay, None
            log.warning(
                "worker %s (key %r) exited with %s; restarting in %.1f s",
                group.worker_id,
                group.key[:64],
                code,
                delay,
            )
        if process is not None and now < process.retry_at:
            return
        environment = {**os.environ, **group.environment()}
        popen = subprocess.Popen(
            self.command,
            env=environment,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals stay ours to send
        )
        self.starts += 1
        log.info("started worker %s (key %r), pid %d", group.worker_id, group.key[:64], popen.pid)
        if process is None:
            self._processes[group.worker_id] = _Process(popen)
        else:
            process.popen = popen

    def stop(self, group: WorkerGroup) -> None:
        """SIGTERM the group's process, SIGKILL it after ``stop_grace``; by PID."""
        process = self._processes.pop(group.worker_id, None)
        if process is not None and process.popen is not None:
            _terminate(process.popen, self.stop_grace)
            log.info("stopped worker %s (key %r)", group.worker_id, group.key[:64])

    def close(self) -> None:
        """Stop every worker this driver started."""
        for process in list(self._processes.values()):
            if process.popen is not None:
                _terminate(process.popen, self.stop_grace)
        self._processes.clear()


def _terminate(popen: subprocess.Popen[bytes], grace: float) -> None:
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(popen.pid, signal.SIGKILL)
            popen.wait(grace)


DRIVERS = ("subprocess", "noop")
"""``--driver`` values."""

__all__ = ["DRIVERS", "NoopDriver", "SubprocessDriver", "WorkerGroup", "WorkerGroupDriver"]

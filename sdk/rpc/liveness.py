"""A worker's liveness duties while handlers run (Halibut): heartbeat each running
call on its caller's reply queue, and cancel the calls of callers that went away.

Durable requests (``Session.request_durable``) are left out of both: nobody waits on
them, and their caller may be gone on purpose (it fetches the reply later).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from holdfast.sdk import tracing
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.jobs import Job
from holdfast.sdk.rpc.options import WorkerOptions

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

log = logging.getLogger("holdfast.sdk.rpc.worker")


class Beater:
    """The heartbeat thread of a ``Worker``."""

    def __init__(
        self,
        session: Session,
        options: WorkerOptions,
        control_uri: str,
        running: Callable[[], list[Job]],
        reply_queue: Callable[[str], Queue],
        stopping: threading.Event,
    ) -> None:
        self._session = session
        self._options = options
        self._control_uri = control_uri
        self._running = running
        self._reply_queue = reply_queue
        self._stopping = stopping
        self._absent_since: dict[str, float] = {}
        self._thread = threading.Thread(target=self._loop, name="holdfast-beat", daemon=True)

    def start(self) -> None:
        """Start beating (the worker's queues are open)."""
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end once ``stopping`` is set."""
        self._thread.join(timeout)

    def _loop(self) -> None:
        options = self._options
        tick = min(options.first_beat_after, options.heartbeat_interval) / 2
        next_check = time.monotonic() + options.heartbeat_interval
        while not self._stopping.wait(tick):
            now = time.monotonic()
            jobs = [job for job in self._running() if not job.durable]
            # While disconnected a beat would only pile up, stale, behind the reply.
            connected = self._session.connected
            for job in jobs:
                if connected and now >= job.next_beat and not job.request.cancelled.is_set():
                    job.next_beat = now + options.heartbeat_interval
                    self._beat(job)
            if now >= next_check:
                next_check = now + options.heartbeat_interval
                self._check_callers(jobs, now)

    def _beat(self, job: Job) -> None:
        """Heartbeat a call, running or waiting for a thread (so it can be cancelled)."""
        properties = wire.beat_properties(
            job.request.guid, self._control_uri, self._options.heartbeat_interval
        )
        with contextlib.suppress(HoldfastError), tracing.suppressed():
            self._reply_queue(job.reply_to).post(b"", properties)

    def _check_callers(self, jobs: list[Job], now: float) -> None:
        """Cancel the calls of callers whose reply queue lost its consumer for good."""
        grace = self._options.caller_grace
        callers = {job.reply_to for job in jobs}
        for gone in set(self._absent_since) - callers:
            del self._absent_since[gone]
        for reply_to in callers:
            try:
                present = self._session.has_workers(reply_to, timeout=grace)
            except HoldfastError:
                continue  # no answer (the link is down): no verdict
            if present:
                self._absent_since.pop(reply_to, None)
                continue
            since = self._absent_since.setdefault(reply_to, now)
            if now - since >= grace:
                log.info("caller of %s is gone: cancelling its calls", reply_to[:200])
                for job in jobs:
                    if job.reply_to == reply_to:
                        job.request.cancelled.set()

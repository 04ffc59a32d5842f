"""``PoolManager``: one keyed worker pool's manager, assembled from its parts."""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass

from holdfast.pool.activity import DEBOUNCE, ActivityReports
from holdfast.pool.control import ActivityLoop, GroupLoop, QueueLoop
from holdfast.pool.drivers import NoopDriver, WorkerGroup, WorkerGroupDriver
from holdfast.pool.leader import Leadership
from holdfast.pool.orphans import Forwarder, OrphanProcessor
from holdfast.pool.reconcile import Reconciler
from holdfast.pool.startfail import StartFailureReplies
from holdfast.pool.supervisor import Supervisor
from holdfast.pool.tracker import PoolTracker
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import events as ev
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.events import log_event
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.poolnames import KEY_HASH_CHARS, PoolNames
from holdfast.sdk.queue import Queue
from holdfast.sdk.session import Session

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How a pool manager runs (the ``holdfast-pool`` flags)."""

    address: str
    """The broker (or proxy) the manager and its workers connect to."""
    admin_address: str
    """The broker whose admin service sets the pool's policies."""
    pool: str
    """The pool URI, ``hf://<domain>/<pool>``."""
    unbind_delay: float = 30.0
    """Seconds without activity before a key's queue stops taking requests."""
    stop_delay: float = 60.0
    """Seconds after that before its worker group stops and its queue goes."""
    max_deliveries: int = 3
    """Deliveries after which a request (one that keeps crashing workers) goes to the
    pool's poison queue, and its caller gets a dead-letter error."""
    orphan_attempts: int = 20
    """Tries to forward an orphan before it is dead-lettered to the poison queue."""
    token: str | None = None
    """The manager's token (default ``$HOLDFAST_TOKEN``); it needs ``admin`` for the
    pool's policies. Workers get ``$HOLDFAST_TOKEN`` from the manager's environment."""
    tls_ca: str | None = None
    """PEM CA of the broker's certificate: TLS; workers get it as ``HOLDFAST_TLS_CA``."""
    processing_timeout: float | None = None
    """Seconds a worker may spend on one request before it is replaced and the
    request given back (``--processing-timeout``); None: no limit."""

    def __post_init__(self) -> None:
        PoolNames.of(self.pool)
        delays = (("--unbind-delay", self.unbind_delay), ("--stop-delay", self.stop_delay))
        for flag, delay in delays:
            if not 0 < delay < math.inf:  # NaN too: a key that never goes idle
                raise ValueError(f"{flag} must be a number of seconds > 0, not {delay}")
        if self.max_deliveries < 1 or self.orphan_attempts < 1:
            raise ValueError("--max-deliveries must be >= 1")
        if self.processing_timeout is not None and not 0 < self.processing_timeout < math.inf:
            raise ValueError("--processing-timeout must be > 0 seconds")


class PoolStartError(Exception):
    """The manager could not start; ``flag`` names the setting to look at."""

    def __init__(self, flag: str, value: str, cause: BaseException, hint: str = "") -> None:
        reason = (str(cause).splitlines() or [type(cause).__name__])[0].strip("'\"")
        if len(reason) > 300:  # gRPC's detail after the named cause: cut at a word
            reason = reason[:300].rsplit(" ", 1)[0] + " ..."
        super().__init__(f"{flag} {value}{hint}: {reason}")
        self.flag = flag


class PoolManager:
    """Runs a pool: ``start()``, then ``stop()`` (which stops its worker groups)."""

    def __init__(self, settings: PoolSettings, driver: WorkerGroupDriver) -> None:
        self.settings = settings
        self.names = PoolNames.of(settings.pool)
        self.driver = driver
        self.tracker = PoolTracker(
            settings.unbind_delay, settings.stop_delay, activity_slack=DEBOUNCE
        )
        self.leadership = Leadership(self.names)
        self._session = Session(
            settings.address,
            on_event=self._on_event,
            options=SessionOptions(
                token=settings.token or os.environ.get("HOLDFAST_TOKEN") or None,
                tls_ca=settings.tls_ca,
            ),
        )
        self._admin = AdminClient(
            settings.admin_address, token=settings.token, tls_ca=settings.tls_ca
        )
        self._forwarder = Forwarder(self._session)
        active = lambda: self.leadership.active  # noqa: E731
        self.orphans = OrphanProcessor(self.tracker, self.names, self._forwarder, active)
        self.start_failures = StartFailureReplies(self._session)
        self.supervisor = Supervisor(
            driver,
            self.start_failures.fail,
            self.start_failures.clear,
            # Workers started by hand are the operator's to replace.
            frozen_after=None if isinstance(driver, NoopDriver) else settings.processing_timeout,
            linked=lambda: self._session.connected,
        )
        self.activity = ActivityReports(
            self.tracker, on_started=self.supervisor.ready, on_seen=self.supervisor.seen
        )
        self.reconciler = Reconciler(self.tracker, self._admin, self.names)
        self._loops = (
            QueueLoop(
                self.tracker,
                active,
                self._admin,
                self.names,
                settings.max_deliveries,
                self._forwarder.release,
                self.reconciler,
            ),
            GroupLoop(
                self.tracker, active, self._admin, self.names, self.supervisor, self.group_of
            ),
            ActivityLoop(
                self.tracker, active, self._session, self.names.activity, self.activity.on_message
            ),
        )
        self._consumers: list[Queue] = []
        self._events_lock = threading.Lock()
        self._held_events: list[ev.SessionEvent] | None = []
        self._quiet = False

    def group_of(self, key: str) -> WorkerGroup:
        """The worker group of ``key``."""
        queue = self.names.key_queue(key)
        digest = queue.rsplit("key-", 1)[1][:KEY_HASH_CHARS]
        return WorkerGroup(
            self.names.uri,
            key,
            f"{self.names.pool}-{digest[:12]}",
            queue,
            self.settings.address,
            self.settings.tls_ca,
            self.settings.processing_timeout,
        )

    def start(self) -> None:
        """Set the pool's policies, compete for leadership, consume orphans and
        activity, run the control loops. ``PoolStartError`` names the flag whose
        broker refused or could not be reached; the manager is closed then (no
        ``stop()`` to call), quietly: its error is the one thing to report."""
        try:
            self._start()
        except PoolStartError:
            self._abandon()
            raise
        self._release_events()
        log.info("pool %s: manager started", self.names.uri)

    def _start(self) -> None:
        names = self.names
        try:
            self._admin.set_policy(names.key_template, QueuePolicy(redirect=names.orphans))
            self._admin.set_policy(
                names.orphans,
                QueuePolicy(max_deliveries=self.settings.orphan_attempts, dead_letter=names.poison),
            )
        except HoldfastError as error:
            admin = self.settings.admin_address
            if admin == self.settings.address:
                hint = " (admin calls go there too unless --admin-address names a broker)"
                raise PoolStartError("--address", admin, error, hint) from error
            raise PoolStartError("--admin-address", admin, error) from error
        try:
            self.leadership.start(self._session)
            orphans = self.orphans.on_message
            self._consumers.append(
                self._session.open_queue(names.orphans, read=True, on_message=orphans)
            )
        except HoldfastError as error:
            raise PoolStartError("--address", self.settings.address, error) from error
        for loop in self._loops:
            loop.start()

    def stop(self) -> None:
        """Stop the loops and the worker groups this manager started, then give the
        token back (the next manager starts its own workers as the keys need them):
        the workers stop first, so no key has two at once."""
        for loop in self._loops:
            loop.stop()
        self._close_parts()
        log.info("pool %s: manager stopped", self.names.uri)

    def _abandon(self) -> None:
        """Close what ``__init__`` made after a failed start. No loop ran and no worker
        started, so there is nothing to report stopping (no SessionClosed, no
        "manager stopped" after the start-up error)."""
        with self._events_lock:
            self._held_events = None
            self._quiet = True
        self._close_parts()

    def _close_parts(self) -> None:
        """Give the token back, stop the workers, close the sessions: workers first
        (``driver``), so no key has two at once when the next manager takes over."""
        self.leadership.stop()
        self.driver.close()
        self.orphans.close()
        self.start_failures.close()
        self._session.close(timeout=5)
        self._admin.close()

    def _release_events(self) -> None:
        """Log the session events held while starting, then log them as they come."""
        with self._events_lock:
            for event in self._held_events or ():
                log_event(event)
            self._held_events = None

    def _on_event(self, event: ev.SessionEvent) -> None:
        self.leadership.on_event(event)
        # Held until the start is decided: a start that fails reports one line (its
        # cause), not the session's Connected or SessionFailed before it.
        with self._events_lock:
            if self._held_events is not None:
                self._held_events.append(event)
            elif not self._quiet:
                log_event(event)


__all__ = ["PoolManager", "PoolSettings", "PoolStartError"]

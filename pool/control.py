"""The control loops that converge a pool's actual state on the tracker's, and the
activity consumer that runs beside them (``ActivityLoop``: only the active manager
takes the workers' activity reports).

The *queue loop* owns the key queues' policies. ACTIVE: the key queue gets a policy
of its own (the pool's delivery limit, dead letters to the pool's poison queue), so
it takes requests (it is *bound*); UNBOUND and STOPPED: its own policy is cleared, so
the pool's template redirects new requests to the orphan queue. A STOPPED key's queue
is deleted once its group has stopped (a caller still holding the queue open keeps
it; the broker drops it once unused). It also applies the idle delays
(``PoolTracker.expire``).

The *group loop* owns the worker groups. ACTIVE and UNBOUND: the group runs (the
driver restarts a dead one). STOPPED: the group keeps running until the key's queue
is unbound and empty (nothing ready, nothing unconfirmed), then stops: a request
that arrived before the unbind is served, one after goes to the orphans.

The group loop runs the groups through the supervisor (``holdfast.pool.supervisor``:
restarts, back-off, start failures, processing timeouts), stops any group the
tracker no longer has, and stops every group when this manager stops being the
active one: a pool never has two workers for one key because its manager lost its
link. The queue loop also reconciles the pool's key queues with the tracker
(``holdfast.pool.reconcile``).

Each records the generation it converged on; neither acts for a manager that is not
the active one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from holdfast.pool.drivers import WorkerGroup
from holdfast.pool.reconcile import Reconciler
from holdfast.pool.supervisor import Supervisor
from holdfast.pool.tracker import KeyRecord, KeyState, PoolTracker
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import HoldfastError, QueueInUseError, QueueNotFoundError
from holdfast.sdk.poolnames import PoolNames
from holdfast.sdk.queue import Queue
from holdfast.sdk.session import Session
from holdfast.sdk.types import Message

log = logging.getLogger(__name__)

TICK = 0.2
"""Seconds between passes of a loop when nothing wakes it sooner."""


class ControlLoop:
    """A thread that runs ``tick`` while the manager is the active one."""

    name = "control"

    def __init__(self, tracker: PoolTracker, is_active: Callable[[], bool]) -> None:
        self._tracker = tracker
        self._is_active = is_active
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"holdfast-pool-{self.name}")

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and wait for its thread."""
        self._stopped.set()
        if self._thread.ident is not None:  # started
            self._thread.join(10)

    def _run(self) -> None:
        was_active = False
        while not self._stopped.is_set():
            active = self._is_active()
            try:
                if active:
                    if not was_active:
                        self.became_active()
                    self._pass()
                elif was_active:
                    self.became_standby()
            except HoldfastError as error:  # the broker is away: next pass
                log.warning("%s loop: %s", self.name, error)
            except Exception:
                log.exception("%s loop", self.name)
            was_active = active
            self._tracker.wait_changed(TICK)

    def _pass(self) -> None:
        self.before_pass()
        records = self._tracker.snapshot()
        for record in records:
            try:
                self.converge(record)
            except HoldfastError as error:  # the broker is away: next pass
                log.warning("%s loop, key %r: %s", self.name, record.key[:64], error)
            except Exception:
                log.exception("%s loop, key %r", self.name, record.key[:64])
        self.after_pass(records)

    def became_active(self) -> None:
        """This manager just became the active one (nothing by default)."""

    def became_standby(self) -> None:
        """This manager just stopped being the active one (nothing by default)."""

    def before_pass(self) -> None:
        """Run before each pass over the keys (nothing by default)."""

    def after_pass(self, records: list[KeyRecord]) -> None:
        """Run after each pass over the keys (nothing by default)."""

    def converge(self, record: KeyRecord) -> None:
        """Make the actual state of one key match ``record``."""
        raise NotImplementedError


class QueueLoop(ControlLoop):
    """Binds and unbinds key queues (see the module docstring)."""

    name = "queues"

    def __init__(
        self,
        tracker: PoolTracker,
        is_active: Callable[[], bool],
        admin: AdminClient,
        names: PoolNames,
        max_deliveries: int,
        release: Callable[[str], None],
        reconciler: Reconciler,
    ) -> None:
        super().__init__(tracker, is_active)
        self._admin = admin
        self._names = names
        self._bound = QueuePolicy(max_deliveries=max_deliveries, dead_letter=names.poison)
        self._release = release
        self._reconciler = reconciler

    def became_active(self) -> None:
        """Reconcile at once: an earlier manager may have left key queues behind."""
        self._reconciler.reset()

    def before_pass(self) -> None:
        """Apply the idle delays here, so that nothing changes state for a manager that
        is not the active one; reconcile now and then."""
        self._tracker.expire()
        self._reconciler.maybe_run()

    def converge(self, record: KeyRecord) -> None:
        """Bind an ACTIVE key's queue; unbind the others; delete a stopped one's."""
        queue = self._names.key_queue(record.key)
        if record.queue_generation < record.generation:
            if record.state is KeyState.ACTIVE:
                self._admin.set_policy(queue, self._bound)
                log.info("key %r: queue %s bound", record.key[:64], queue)
            else:
                with self._tracker.key_lock(record.key):
                    self._admin.set_policy(queue, QueuePolicy())
                    self._release(queue)
                log.info("key %r: queue %s unbound", record.key[:64], queue)
            self._tracker.converged(record.key, record.generation, queue=True)
        elif record.state is KeyState.STOPPED and record.group_generation >= record.generation:
            try:
                self._admin.delete(queue)
            except QueueInUseError:
                pass  # callers keep it open: it redirects, and goes once unused
            except QueueNotFoundError:
                pass
            if self._tracker.forget(record.key, record.generation):
                log.info("key %r: stopped and forgotten", record.key[:64])


class GroupLoop(ControlLoop):
    """Keeps worker groups running, and stops them once their key is drained."""

    name = "groups"

    def __init__(
        self,
        tracker: PoolTracker,
        is_active: Callable[[], bool],
        admin: AdminClient,
        names: PoolNames,
        supervisor: Supervisor,
        group_of: Callable[[str], WorkerGroup],
    ) -> None:
        super().__init__(tracker, is_active)
        self._admin = admin
        self._names = names
        self._supervisor = supervisor
        self._group_of = group_of

    def became_standby(self) -> None:
        """Another manager acts now: stop this one's workers (it starts its own)."""
        log.warning(
            "pool %s: not the active manager any more: stopping its workers", self._names.uri
        )
        self._supervisor.stop_all()

    def before_pass(self) -> None:
        """Judge the workers that exited; adopt (or stop) workers of an earlier manager."""
        driver = self._supervisor.driver
        for stranger in self._supervisor.refresh():
            if stranger.exit_status is None and driver.adopt(stranger):
                self._supervisor.adopt(self._group_of(stranger.key), stranger)
                self._tracker.touch(stranger.key)
                log.info("adopted worker %s (key %r)", stranger.worker_id, stranger.key[:64])
            else:
                driver.stop(stranger.worker_id)

    def after_pass(self, records: list[KeyRecord]) -> None:
        """Stop the groups of keys the tracker no longer has."""
        self._supervisor.retain(self._group_of(record.key).worker_id for record in records)

    def converge(self, record: KeyRecord) -> None:
        """Run the groups of ACTIVE and UNBOUND keys; stop a STOPPED key's once drained."""
        group = self._group_of(record.key)
        if record.state is not KeyState.STOPPED:
            self._supervisor.ensure_running(group)
            self._tracker.converged(record.key, record.generation, queue=False)
            return
        if record.group_generation >= record.generation:
            return
        if record.queue_generation < record.generation or not self._drained(record.key):
            self._supervisor.ensure_running(group)  # finish what the queue holds first
            return
        self._supervisor.stop(group)
        self._tracker.converged(record.key, record.generation, queue=False)

    def _drained(self, key: str) -> bool:
        try:
            stats = self._admin.stats(self._names.key_queue(key))
        except QueueNotFoundError:
            return True
        return stats.ready == 0 and stats.unconfirmed == 0


class ActivityLoop(ControlLoop):
    """Consumes the workers' activity reports while this manager is the active one. A
    standby that took reports would keep them from the active one, whose ``started``
    verdicts and idle timers need every one (with a report taken by the standby, a
    worker that crashed on a request was judged one that never started, and a key went
    idle early)."""

    name = "activity"

    def __init__(
        self,
        tracker: PoolTracker,
        is_active: Callable[[], bool],
        session: Session,
        uri: str,
        on_message: Callable[[Message], Any],
    ) -> None:
        super().__init__(tracker, is_active)
        self._session = session
        self._uri = uri
        self._on_message = on_message
        self._queue: Queue | None = None

    def _pass(self) -> None:
        # Opened on each pass until it is (the broker may be away when this one wins).
        if self._queue is None or not self._queue.is_open:
            self._queue = self._session.open_queue(
                self._uri, read=True, on_message=self._on_message, timeout=5
            )

    def became_standby(self) -> None:
        """Another manager acts now: leave the reports to it."""
        queue, self._queue = self._queue, None
        if queue is not None and queue.is_open:
            queue.close(timeout=5)


__all__ = ["TICK", "ActivityLoop", "GroupLoop", "QueueLoop"]

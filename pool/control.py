"""The two control loops that converge a pool's actual state on the tracker's.

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

Each records the generation it converged on; neither acts for a manager that is not
the active one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from holdfast.pool.drivers import WorkerGroup, WorkerGroupDriver
from holdfast.pool.tracker import KeyRecord, KeyState, PoolTracker
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import HoldfastError, QueueInUseError, QueueNotFoundError
from holdfast.sdk.poolnames import PoolNames

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
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self._is_active():
                self.before_pass()
                for record in self._tracker.snapshot():
                    try:
                        self.converge(record)
                    except HoldfastError as error:  # the broker is away: next pass
                        log.warning("%s loop, key %r: %s", self.name, record.key[:64], error)
                    except Exception:
                        log.exception("%s loop, key %r", self.name, record.key[:64])
            self._tracker.wait_changed(TICK)

    def before_pass(self) -> None:
        """Run before each pass over the keys (nothing by default)."""

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
    ) -> None:
        super().__init__(tracker, is_active)
        self._admin = admin
        self._names = names
        self._bound = QueuePolicy(max_deliveries=max_deliveries, dead_letter=names.poison)
        self._release = release

    def before_pass(self) -> None:
        """Apply the idle delays here, so that nothing changes state for a manager that
        is not the active one."""
        self._tracker.expire()

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
        driver: WorkerGroupDriver,
        group_of: Callable[[str], WorkerGroup],
    ) -> None:
        super().__init__(tracker, is_active)
        self._admin = admin
        self._names = names
        self._driver = driver
        self._group_of = group_of

    def converge(self, record: KeyRecord) -> None:
        """Run the groups of ACTIVE and UNBOUND keys; stop a STOPPED key's once drained."""
        group = self._group_of(record.key)
        if record.state is not KeyState.STOPPED:
            self._driver.ensure_running(group)
            self._tracker.converged(record.key, record.generation, queue=False)
            return
        if record.group_generation >= record.generation:
            return
        if record.queue_generation < record.generation or not self._drained(record.key):
            self._driver.ensure_running(group)  # finish what the queue holds first
            return
        self._driver.stop(group)
        self._tracker.converged(record.key, record.generation, queue=False)

    def _drained(self, key: str) -> bool:
        try:
            stats = self._admin.stats(self._names.key_queue(key))
        except QueueNotFoundError:
            return True
        return stats.ready == 0 and stats.unconfirmed == 0


__all__ = ["TICK", "GroupLoop", "QueueLoop"]

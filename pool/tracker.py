"""The pool state tracker: what each key is expected to be, with generations.

Each key's expected state changes only here: ``activate`` (a request arrived: the
key must be served), and ``expire`` (two-stage idle shutdown: ACTIVE -> UNBOUND after
``unbind_delay`` without activity, UNBOUND -> STOPPED after ``stop_delay`` more).
Every change increments the key's generation. The control loops converge the actual
state on the expected one and record the generation they reached
(``queue_generation``, ``group_generation``), so a waiter can tell "the queue is bound
for *this* activation" from a stale "bound" of an earlier one, and no loop acts on a
state that has moved on. Thread-safe: one condition guards everything.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace


class KeyState(enum.Enum):
    """What a key is expected to be."""

    ACTIVE = "active"
    """Its queue takes requests and its worker group runs."""
    UNBOUND = "unbound"
    """Idle: its queue no longer takes new requests (they go to the orphans), its
    group still runs, finishing what the queue holds."""
    STOPPED = "stopped"
    """Its group stops once the queue is empty; the queue is removed."""


@dataclass(slots=True)
class KeyRecord:
    """One key's expected state and what the control loops converged on."""

    key: str
    state: KeyState
    generation: int
    changed_at: float
    last_activity: float
    queue_generation: int = 0
    group_generation: int = 0


class PoolTracker:
    """The expected state of every key of one pool."""

    def __init__(
        self,
        unbind_delay: float,
        stop_delay: float,
        clock: Callable[[], float] = time.monotonic,
        activity_slack: float = 0.0,
    ) -> None:
        if not (unbind_delay > 0 and stop_delay > 0):  # NaN too
            raise ValueError("unbind_delay and stop_delay must be > 0 seconds")
        self.unbind_delay = unbind_delay
        self.stop_delay = stop_delay
        self.activity_slack = activity_slack
        """Seconds a reported activity may be older than its touch (the reports'
        debounce): added to both idle delays, so a stage is never shorter."""
        self._clock = clock
        self._keys: dict[str, KeyRecord] = {}
        self._changed = threading.Condition()
        self._locks: dict[str, threading.Lock] = {}

    def activate(self, key: str) -> int:
        """A request for ``key`` arrived: it must be ACTIVE. Returns the generation at
        which it is (the same one if it already was)."""
        with self._changed:
            return self._activate(key, self._clock())

    def _activate(self, key: str, now: float) -> int:
        record = self._keys.get(key)
        if record is None:
            record = self._keys[key] = KeyRecord(key, KeyState.ACTIVE, 1, now, now)
        elif record.state is not KeyState.ACTIVE:
            record.state, record.changed_at = KeyState.ACTIVE, now
            record.generation += 1
        record.last_activity = now
        self._changed.notify_all()
        return record.generation

    def touch(self, key: str) -> None:
        """A worker of ``key`` reported activity: postpone its idle shutdown. A key the
        tracker does not know (a manager restarted under running workers) becomes
        ACTIVE, so its group is adopted and its queue bound."""
        with self._changed:
            record = self._keys.get(key)
            if record is None:
                self._activate(key, self._clock())
            else:
                record.last_activity = self._clock()

    def expire(self) -> int:
        """Apply the idle delays; returns how many keys changed state."""
        changed = 0
        with self._changed:
            now = self._clock()
            for record in self._keys.values():
                # The true last activity may be up to the slack after the touch.
                since = max(record.last_activity + self.activity_slack, record.changed_at)
                idle = now - since
                if record.state is KeyState.ACTIVE and idle >= self.unbind_delay:
                    record.state = KeyState.UNBOUND
                elif record.state is KeyState.UNBOUND and idle >= self.stop_delay:
                    record.state = KeyState.STOPPED
                else:
                    continue
                record.changed_at = now
                record.generation += 1
                changed += 1
            if changed:
                self._changed.notify_all()
        return changed

    def snapshot(self) -> list[KeyRecord]:
        """Copies of every key's record."""
        with self._changed:
            return [replace(record) for record in self._keys.values()]

    def get(self, key: str) -> KeyRecord | None:
        """A copy of ``key``'s record."""
        with self._changed:
            record = self._keys.get(key)
            return None if record is None else replace(record)

    def converged(self, key: str, generation: int, *, queue: bool) -> None:
        """A control loop made ``key``'s actual state match ``generation``."""
        with self._changed:
            record = self._keys.get(key)
            if record is None:
                return
            if queue:
                record.queue_generation = max(record.queue_generation, generation)
            else:
                record.group_generation = max(record.group_generation, generation)
            self._changed.notify_all()

    def wait_bound(self, key: str, generation: int, timeout: float) -> bool:
        """Wait until ``key`` is ACTIVE with its queue bound for ``generation`` or later."""
        deadline = self._clock() + timeout
        with self._changed:
            while True:
                record = self._keys.get(key)
                if record is None or record.generation > generation:
                    return False  # moved on: the caller activates again
                if record.state is KeyState.ACTIVE and record.queue_generation >= generation:
                    return True
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.5))

    def wait_changed(self, timeout: float) -> None:
        """Sleep until some key changes or ``timeout`` passes (the loops' tick)."""
        with self._changed:
            self._changed.wait(timeout)

    def forget(self, key: str, generation: int) -> bool:
        """Drop a STOPPED key whose loops converged at ``generation``."""
        with self._changed:
            record = self._keys.get(key)
            if record is None or record.generation != generation:
                return False
            if record.state is not KeyState.STOPPED:
                return False
            del self._keys[key]
            return True

    def key_lock(self, key: str) -> threading.Lock:
        """The lock that keeps forwarding to ``key``'s queue and unbinding it apart: a
        forward never lands after the queue stopped taking requests."""
        with self._changed:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.Lock()
            return lock


__all__ = ["KeyRecord", "KeyState", "PoolTracker"]

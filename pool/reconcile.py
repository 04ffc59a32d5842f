"""Reconciliation: what the broker says about the pool's key queues against what
the tracker expects, converged at start-up and every ``RECONCILE_INTERVAL``.

A manager that starts after another died (killed with its workers: a lost host)
finds key queues that no tracker knows: some bound (their own policy: they take
requests) with nobody serving them, some holding requests. Without this, such a key
stays bound to a dead worker and its requests wait out their pickup timeout. So, for
every key queue of the pool the tracker does not track:

- it holds requests (ready): read the key from one of them (``x-rpc-key``; the
  queue's name is a hash of it) and activate it: its worker starts and serves them;
- it is empty and bound: unbind it (new requests then go the orphan way, which
  activates the key) and delete it if nobody holds it open.

Keys the tracker does track are the control loops' business; workers the driver
lists that nobody tracks are stopped by the supervisor (``Supervisor.retain``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from holdfast.pool.tracker import PoolTracker
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk.admin import AdminClient, QueueInfo
from holdfast.sdk.errors import HoldfastError, QueueInUseError, QueueNotFoundError
from holdfast.sdk.poolnames import PoolNames, check_key
from holdfast.sdk.rpc import wire

log = logging.getLogger(__name__)

RECONCILE_INTERVAL = 2.0
"""Seconds between two reconciliations while this manager is the active one."""


class Reconciler:
    """Converges untracked key queues (see the module docstring)."""

    def __init__(
        self,
        tracker: PoolTracker,
        admin: AdminClient,
        names: PoolNames,
        clock: Callable[[], float] = time.monotonic,
        interval: float = RECONCILE_INTERVAL,
    ) -> None:
        self._tracker = tracker
        self._admin = admin
        self._names = names
        self._clock = clock
        self._interval = interval
        self._next = 0.0
        self.activated = 0
        """Untracked keys found holding requests, and activated."""
        self.unbound = 0
        """Untracked bound key queues found empty, and unbound."""

    def reset(self) -> None:
        """Reconcile on the next pass (this manager just became the active one)."""
        self._next = 0.0

    def maybe_run(self) -> None:
        """Reconcile if the interval has passed since the last run."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        try:
            self.run()
        except HoldfastError as error:  # the broker is away: next time
            log.warning("reconciling pool %s: %s", self._names.uri, error)

    def run(self) -> None:
        """One reconciliation of every key queue of the pool."""
        prefix = self._names.key_queue_prefix
        tracked = {self._names.key_queue(record.key) for record in self._tracker.snapshot()}
        for info in self._admin.queues():
            if info.uri.startswith(prefix) and info.uri not in tracked:
                self._converge(info)

    def _converge(self, info: QueueInfo) -> None:
        if info.ready:
            key = self._key_of(info.uri)
            if key is not None:
                self._tracker.activate(key)
                self.activated += 1
                log.info(
                    "key %r: %d requests waiting in %s and no worker tracked: activated",
                    key[:64],
                    info.ready,
                    info.uri,
                )
        elif not info.unconfirmed and info.policy.redirect is None:
            self._admin.set_policy(info.uri, QueuePolicy())
            self.unbound += 1
            log.info("%s: bound with nobody serving it: unbound", info.uri)
            # Held open (a caller): it redirects now, and goes once unused.
            with contextlib.suppress(QueueInUseError, QueueNotFoundError):
                self._admin.delete(info.uri)

    def _key_of(self, uri: str) -> str | None:
        for message in self._admin.peek(uri, 1):
            key = message.properties.get(wire.KEY)
            try:
                check_key(key)
            except HoldfastError:
                break
            assert key is not None
            if self._names.key_queue(key) == uri:
                return key
        log.warning("%s holds requests without a key that names it: left alone", uri)
        return None


__all__ = ["RECONCILE_INTERVAL", "Reconciler"]

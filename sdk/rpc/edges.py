"""When each call in flight is next due, for one timer per caller, not one per call.

A heap of ``(edge, order, key)``: plain tuples, compared in C. The asyncio caller had
a loop ``TimerHandle`` per call, pushed onto the loop's heap and cancelled when the
reply came; each push and each pop of a cancelled handle compared handles with
``TimerHandle.__lt__``, a Python method (about 12 calls a call at 2,048 in flight).
A call that ended is not taken out (that would be O(n)): its entry is skipped when it
comes due, and entries of ended calls are dropped now and then so the heap stays
O(calls in flight), not every call of the last timeout.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping


class Edges:
    """Calls' next edges (``CallState.next_edge``) by key (the call's GUID bytes)."""

    __slots__ = ("_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, bytes]] = []
        self._order = itertools.count()

    def add(self, edge: float, key: bytes, live: Mapping[bytes, object]) -> bool:
        """Time the call ``key`` at ``edge``; True if it is now the first due. ``live``:
        the keys of the calls in flight (the others' entries may be dropped)."""
        heap = self._heap
        if len(heap) > 2 * len(live) + 1024:
            heap[:] = [entry for entry in heap if entry[2] in live]
            heapq.heapify(heap)
        order = next(self._order)
        heapq.heappush(heap, (edge, order, key))
        return heap[0][1] == order

    def first(self) -> float | None:
        """The earliest edge (possibly of a call that ended), or None."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[bytes]:
        """Take out the keys whose edge is at or before ``now`` (ended calls' too)."""
        heap, due = self._heap, []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        return due


__all__ = ["Edges"]

"""How many handlers an asyncio ``Worker`` runs at once.

``asyncio.Semaphore`` counts the same, but ``async with`` it is two coroutine calls and
a ``locked()`` check a request even when a slot is free, which is nearly always: the
broker hands a worker at most ``concurrency`` plus its prefetch. Here a free slot is
taken without awaiting anything (``take_now``); only a request beyond ``concurrency``
waits, in arrival order, as with the semaphore. Measured with the asyncio echo worker
under callgrind, with the reply memory (``holdfast.sdk.rpc.replies``): 367k -> 343k
instructions a call for the two.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """``count`` slots; ``take_now`` or ``await take()``, then ``give`` once done."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a free slot if there is one and nobody waits for it."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot, after those that waited first."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.give()  # handed a slot as the cancel came: pass it on
            raise

    def give(self) -> None:
        """A slot is free again: to the first waiter still waiting, or kept."""
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._free += 1


__all__ = ["Slots"]

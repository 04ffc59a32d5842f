"""Frames a client sent behind an OpenQueue the broker has not answered yet.

The broker takes a client's frames in order and answers an OpenQueue before it reads
the next frame, so a client may send PUTs (or a ConfigureQueue, or a CloseQueue) for a
queue right behind its OpenQueue, without waiting for the answer. The proxy opens the
queue on its upstream session, which takes a round trip to the broker: a PUT (or a
configure, or a close) for a handle whose open is still on its way is held here, with
every frame after it (the client's order is kept), and the client's stream is not read
until the open is answered. Then the held frames are handled as if they had just
arrived: PUTs into a queue whose open failed get the ACK a broker gives PUTs into a
queue that is not open. At most the frames of one gRPC message are held, since
reading stops.

A client that waits for its opens (the SDK always does) never has a frame held.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any


class OpenWaits:
    """One client's opens in flight upstream, and the frames held behind them."""

    def __init__(self) -> None:
        self._opening: dict[int, asyncio.Future[None]] = {}
        self._held: deque[tuple[str, Any]] = deque()

    def __bool__(self) -> bool:
        """Whether frames are held."""
        return bool(self._held)

    def started(self, queue_id: int) -> asyncio.Future[None]:
        """The open of client handle ``queue_id`` went upstream; resolve the returned
        future with ``ended`` once it is answered, whatever the answer."""
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._opening[queue_id] = opened
        return opened

    def ended(self, queue_id: int, opened: asyncio.Future[None]) -> None:
        """The open behind ``opened`` is answered (or abandoned)."""
        # The client may have closed the handle and opened the id again meanwhile.
        if self._opening.get(queue_id) is opened:
            del self._opening[queue_id]
        if not opened.done():
            opened.set_result(None)

    def holds(self, kind: str, message: Any) -> bool:
        """Hold frame ``kind`` if it needs an open in flight or frames are held before
        it; whether it was held (else the caller handles it now)."""
        if self._held or (self._opening and self._waits_on(kind, message) is not None):
            self._held.append((kind, message))
            return True
        return False

    async def release(self, handle: Callable[[str, Any], None], ending: Callable[[], bool]) -> None:
        """Hand the held frames to ``handle`` in order, each once the opens it needs are
        answered; return when none is held (or the stream is ending)."""
        while self._held and not ending():
            kind, message = self._held[0]
            opened = self._waits_on(kind, message)
            if opened is not None:
                await opened
                continue
            self._held.popleft()
            handle(kind, message)
        if ending():
            self._held.clear()  # the client is gone: it replays what was not ACKed

    def _waits_on(self, kind: str, message: Any) -> asyncio.Future[None] | None:
        ids: Iterable[int]
        if kind == "puts":
            ids = set(message.queue_ids)
        elif kind in ("configure_queue", "close_queue"):
            # A close behind its open: answered after the open, as the broker answers,
            # and the upstream handle closed rather than abandoned unanswered.
            ids = (message.queue_id,)
        else:
            return None
        for queue_id in ids:
            opened = self._opening.get(queue_id)
            if opened is not None:
                return opened
        return None


__all__ = ["OpenWaits"]

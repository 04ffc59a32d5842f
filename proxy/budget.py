"""The proxy's buffer bound, shared fairly among its clients (``--max-buffer-bytes``).

Every PUT a client posts stays in the proxy until the broker ACKs it (or the proxy
answers it otherwise), and during a broker outage it stays there for the whole
outage. ``BufferBudget`` charges each such PUT to the client that posted it and
releases it with the PUT's outcome. A client is read only while it holds less than
its share of the bound (the bound over the clients connected) and the proxy as a
whole holds less than the bound, not counting the frames larger than their shares
that other clients sent while holding nothing; otherwise its stream is not read,
gRPC flow control stops the client's transport, and the client's own ``post()``
waits and then raises ``BandwidthLimitError``, while the other clients, under their
shares, go on.

The check comes before a client frame is read, so a frame's PUTs are charged only
once it is in: each client keeps room for the most it has been charged for one frame
so far (``reserve``), so the bound holds unless a client's next frame is bigger than
every earlier one. A client holding nothing may always send one frame, so no share is too
small to make progress with.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from holdfast.proto.limits import MIB

DEFAULT_MAX_BUFFER_BYTES = 256 * MIB
"""The proxy's default buffer bound: what a laptop survives during a long outage."""

PUT_BOOKKEEPING_BYTES = 768
"""Bytes charged for one buffered PUT besides its payload and properties: the upstream
engine's tuple and dict entry, the GUID, the route of its ACK. ``bench/proxy_memory.py``
measured 540-770 B of RSS per 1-KiB PUT held beyond its payload; charging the upper
end keeps the bound a bound on memory, not on payload."""


@dataclass(slots=True)
class _Account:
    """What one client holds, and the largest frame it has sent."""

    held: int = 0
    reserve: int = 0
    connected: bool = True


class BufferBudget:
    """Bytes buffered per client against one bound; tells which client may be read."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        """The bound, in bytes, over all clients."""
        self.total = 0
        """Bytes charged now, over all clients (those gone too, until their PUTs end)."""
        self.peak = 0
        """The most bytes ever charged at once."""
        self._accounts: dict[int, _Account] = {}
        self._connected = 0
        self._waiting: dict[int, asyncio.Future[None]] = {}

    @property
    def share(self) -> int:
        """What each connected client may hold."""
        return self.max_bytes // max(1, self._connected)

    def held(self, key: int) -> int:
        """Bytes charged to client ``key``."""
        account = self._accounts.get(key)
        return 0 if account is None else account.held

    def connect(self, key: int) -> None:
        """Client ``key`` connected: it gets a share (the others' shares shrink)."""
        self._accounts[key] = _Account()
        self._connected += 1

    def disconnect(self, key: int) -> None:
        """Client ``key`` left: its share goes to the others; what it holds stays
        charged until its PUTs have their outcomes (they are still buffered)."""
        account = self._accounts.get(key)
        if account is None or not account.connected:
            return
        account.connected = False
        self._connected -= 1
        if not account.held:
            del self._accounts[key]
        # Its reader has ended: a waiter of its own is dropped, not woken.
        self._waiting.pop(key, None)
        self._wake()

    def may_read(self, key: int) -> bool:
        """Whether client ``key`` may send another frame now."""
        account = self._accounts.get(key)
        if account is None or not account.held:
            return True
        reserve = account.reserve or 1  # at its share exactly, it is full
        share = self.share
        if account.held + reserve > share:
            return False
        if self.total + reserve <= self.max_bytes:
            return True
        # Over the bound. A client holding nothing may send one frame larger than its
        # share: that excess (at most one frame a client) is the sender's to wait out,
        # and does not stop this client, under its own share. What others hold because
        # shares shrank as clients joined does: the bound holds there.
        beyond = sum(
            max(0, min(other.held, other.reserve) - share)
            for other in self._accounts.values()
            if other.connected
        )
        return self.total - beyond + reserve <= self.max_bytes

    def read(self, key: int, frame_bytes: int) -> None:
        """Client ``key`` was charged ``frame_bytes`` for one frame: keep room for one as
        large before its next frame is read."""
        account = self._accounts.get(key)
        if account is not None and frame_bytes > account.reserve:
            account.reserve = frame_bytes

    def charge(self, key: int, nbytes: int) -> None:
        """Client ``key``'s PUT of ``nbytes`` is buffered now."""
        account = self._accounts.get(key)
        if account is None:
            account = self._accounts[key] = _Account(connected=False)
        account.held += nbytes
        total = self.total = self.total + nbytes
        if total > self.peak:
            self.peak = total

    def release(self, key: int, nbytes: int) -> None:
        """A PUT of client ``key`` has its outcome: its bytes are free. Call ``wake``
        once after a batch of releases."""
        account = self._accounts.get(key)
        if account is None:
            return
        account.held -= nbytes
        self.total -= nbytes
        if not account.held and not account.connected:
            del self._accounts[key]

    def wake(self) -> None:
        """Let the clients that waited for room, and may be read now, go on."""
        if self._waiting:
            self._wake()

    def _wake(self) -> None:
        for key in [key for key in self._waiting if self.may_read(key)]:
            waiter = self._waiting.pop(key)
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_room(self, key: int) -> None:
        """Return once client ``key`` may send another frame."""
        while not self.may_read(key):
            waiter = self._waiting.get(key)
            if waiter is None or waiter.done():
                waiter = self._waiting[key] = asyncio.get_running_loop().create_future()
            await waiter


__all__ = ["DEFAULT_MAX_BUFFER_BYTES", "PUT_BOOKKEEPING_BYTES", "BufferBudget"]

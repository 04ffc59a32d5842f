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

The check comes before a client frame is read, and an idle client waits in that read
for as long as it is idle: when many idle clients send a frame at once, every one of
those frames is read. So the bound is also checked once a frame is in (``admits``):
a frame that would take the proxy past the bound plus ``slack`` (an eighth of the
bound) is not buffered; its PUTs are answered ``LIMIT_EXCEEDED`` (the SDK keeps them
and sends them again, as for a broker's push-back), and its client is not read again
until there is room for a frame as large (``reserve``). The slack is where
frames of clients holding nothing may go beyond the bound (a newcomer's frame to a
proxy another client filled during an outage, say). Only when the proxy holds
nothing is a frame taken whatever its size, so no bound is too small to make progress
with: the proxy never holds more than the bound plus the slack, or one frame.
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


PROMISE_SECONDS = 0.5
"""How long room stays kept for a client woken to send a frame, if it sends none."""


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
        self.slack = max_bytes // 8
        """What the proxy may hold beyond ``max_bytes`` for clients holding nothing."""
        self.refused = 0
        """Frames answered ``LIMIT_EXCEEDED`` because they did not fit (``admits``)."""
        self._accounts: dict[int, _Account] = {}
        self._connected = 0
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._promised: dict[int, int] = {}
        """Clients woken to send a frame they have not sent yet, and its size: counted
        as held, so that room for one frame does not wake every waiting client."""
        self._promised_total = 0

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
        self.settled(key)
        self._wake()

    def may_read(self, key: int) -> bool:
        """Whether client ``key`` may send another frame now."""
        account = self._accounts.get(key)
        if account is None:
            return True
        total = self.total + self._promised_total - self._promised.get(key, 0)
        if not account.held:
            # Whatever its share, it may send one frame while the proxy has room for one
            # as large as its largest (or holds nothing at all).
            return not total or total + account.reserve <= self.max_bytes + self.slack
        reserve = account.reserve or 1  # at its share exactly, it is full
        share = self.share
        if account.held + reserve > share:
            return False
        if total + reserve <= self.max_bytes:
            return True
        # Over the bound. A client holding nothing may send one frame larger than its
        # share: that excess (within the slack: ``admits``) is the sender's to wait out,
        # and does not stop this client, under its own share. What others hold because
        # shares shrank as clients joined does: the bound holds there.
        beyond = sum(
            max(0, min(other.held, other.reserve) - share)
            for other in self._accounts.values()
            if other.connected
        )
        return total - beyond + reserve <= self.max_bytes

    def read(self, key: int, frame_bytes: int) -> None:
        """Client ``key`` was charged ``frame_bytes`` for one frame: keep room for one as
        large before its next frame is read."""
        account = self._accounts.get(key)
        if account is not None and frame_bytes > account.reserve:
            account.reserve = frame_bytes

    def admits(self, key: int, frame_bytes: int) -> bool:
        """Whether a frame of client ``key`` charged ``frame_bytes`` may be buffered now:
        it keeps the proxy within its bound plus ``slack``, or the proxy holds nothing.
        If not, the client is not read again until a frame as large fits."""
        total = self.total
        if not total or total + frame_bytes <= self.max_bytes + self.slack:
            return True
        self.refused += 1
        self.read(key, frame_bytes)
        return False

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
        for key in list(self._waiting):
            if not self.may_read(key):
                continue
            waiter = self._waiting.pop(key)
            account = self._accounts.get(key)
            if account is not None and account.reserve:
                self._promise(key, account.reserve)
            if not waiter.done():
                waiter.set_result(None)

    def _promise(self, key: int, nbytes: int) -> None:
        self._promised_total += nbytes - self._promised.get(key, 0)
        self._promised[key] = nbytes
        # A client woken may have nothing more to send (its PUTs were sent again while
        # it waited, say): its promise must not keep the room from the others for good.
        asyncio.get_running_loop().call_later(PROMISE_SECONDS, self._expire, key, nbytes)

    def _expire(self, key: int, nbytes: int) -> None:
        if self._promised.get(key) == nbytes:
            self.settled(key)
            self.wake()

    def settled(self, key: int) -> None:
        """Client ``key``'s frame since it was woken has been handled (or it left)."""
        self._promised_total -= self._promised.pop(key, 0)

    async def wait_for_room(self, key: int) -> None:
        """Return once client ``key`` may send another frame."""
        while not self.may_read(key):
            waiter = self._waiting.get(key)
            if waiter is None or waiter.done():
                waiter = self._waiting[key] = asyncio.get_running_loop().create_future()
            await waiter


__all__ = ["DEFAULT_MAX_BUFFER_BYTES", "PUT_BOOKKEEPING_BYTES", "BufferBudget"]

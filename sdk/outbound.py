"""What waits for the wire, and rule 7's measure of it.

Items leave in the order they were queued (a PUT posted before a close reaches the
broker before that close). Their bytes count as *queued* until the shell takes them
(``take``), then as *in the transport* until it reports them sent (``drained``);
both together are what the high watermark is measured against.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from holdfast.proto import pb
from holdfast.sdk.putbuffer import PendingPut
from holdfast.sdk.resend import ResendRun

FRAME_SIZE = 64
"""Bytes a request frame (Hello, open, configure, close) is counted for."""

CONFIRM_SIZE = 24
"""Bytes a CONFIRM is counted for."""


@dataclass(frozen=True, slots=True)
class ConfirmItem:
    """A CONFIRM waiting to be encoded."""

    queue_id: int
    guid: bytes


@dataclass(frozen=True, slots=True)
class ConfirmRun:
    """CONFIRMs of many deliveries of one queue, waiting to be encoded (a proxy settling
    a client's ConfirmBatch: one item, not one per message)."""

    queue_id: int
    guids: list[bytes]


@dataclass(frozen=True, slots=True)
class RejectItem:
    """A REJECT waiting to be encoded (``Message.reject``)."""

    queue_id: int
    guid: bytes
    requeue: bool
    delay_ms: int


OutboundItem = PendingPut | ResendRun | ConfirmItem | ConfirmRun | RejectItem | pb.ClientFrame


class Outbound:
    """The ordered items for the wire and the bytes not yet sent."""

    __slots__ = ("high_watermark", "items", "queued_bytes", "transport_bytes")

    def __init__(self, high_watermark: int) -> None:
        self.items: deque[OutboundItem] = deque()
        """The items in order (the producer appends to it directly on its hot path)."""
        self.high_watermark = high_watermark
        self.queued_bytes = 0
        self.transport_bytes = 0

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, item: OutboundItem, size: int) -> None:
        """Queue an item that counts for ``size`` bytes."""
        self.items.append(item)
        self.queued_bytes += size

    def add_frame(self, frame: pb.ClientFrame) -> None:
        """Queue a request frame (Hello, open, configure, close, a query), counted as
        ``FRAME_SIZE`` bytes."""
        self.add(frame, FRAME_SIZE)

    def take(self) -> deque[OutboundItem]:
        """Everything queued, in order; its bytes are now in the transport. The queue
        itself is handed over (a new one takes its place): ``frames.encode``
        pops each item as it encodes it, so that a long take (a backlog sent again
        after an outage) holds no payload it has sent."""
        items = self.items
        self.items = deque()
        self.transport_bytes += self.queued_bytes
        self.queued_bytes = 0
        return items

    def drained(self, nbytes: int) -> None:
        """The transport sent ``nbytes`` of what it took."""
        self.transport_bytes = max(0, self.transport_bytes - nbytes)

    def clear(self) -> None:
        """The connection is gone: nothing queued for it is sent."""
        self.items.clear()
        self.queued_bytes = self.transport_bytes = 0

    @property
    def over_high_watermark(self) -> bool:
        """True when the bytes not yet sent are at or over the high watermark."""
        return self.queued_bytes + self.transport_bytes >= self.high_watermark

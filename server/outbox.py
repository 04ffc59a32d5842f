"""The frames waiting to go out to one client, and how they are coalesced.

Two lanes feed one writer:

* the ordered lane: ACKs, responses and errors, in the order the client frames
  that caused them were read. The ACKs of a PUT batch may have to wait for a store
  write (an ``AckGroup`` that is not ready yet); everything behind it waits too, so
  an ACK for a PUT read before a CloseQueue goes out before that close's Response.
  Consecutive ready ACK groups leave as one ``AckBatch`` frame.
* the push lane: PUSHes, which never wait behind a store write. The one order they
  keep is with the Responses that open queues: while such a Response waits in the
  ordered lane, PUSHes wait too, so no PUSH overtakes the Response that opened its
  queue handle. Pending PUSHes leave as one ``PushBatch`` frame.

The writer takes one frame per ``context.write()``. While a write waits for gRPC
flow control, more items accumulate and go out together in the next frame: the
batches grow exactly when the link is the bottleneck.

Only the ordered lane counts toward the read bound: it is what reading client
frames produces, so a client that does not read its ACKs stops being read. PUSHes
are bounded by the consumers' flow limits instead (a proxy cuts its clients' limits
to its own before it asks the broker: ``ProxyConfig.max_unconfirmed_bytes``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Protocol

from holdfast.proto import pb
from holdfast.proto.columns import PushRow, ack_batch, push_batch
from holdfast.proto.validate import GUID_BYTES
from holdfast.server.revoked import RevokedDeliveries

AckEntry = tuple[int, bytes, "pb.Status"]
"""An ACK as (queue_id, guid, status); the writer packs them into an AckBatch's columns."""

_payload_of = attrgetter("payload")

_ACK_OVERHEAD = 8
"""Approximate wire bytes of one ACK besides its GUID."""

_PUSH_OVERHEAD = 32
"""Approximate wire bytes of one PUSH besides its GUID, payload and properties."""

MAX_PUSHES_PER_FRAME = 256
"""Most PUSHes in one PushBatch. A consumer's whole window (1000 messages by default)
in one frame is handled as one block: nothing is confirmed, so nothing is refilled,
until the last message of the block was dispatched. Frames of 256 keep several in
flight per window, so the consumer confirms the first while the rest arrive (about
1.5x the PUSH -> CONFIRM rate when this was chosen, direct and through the proxy;
``make bench`` has today's figures)."""


class Pushable(Protocol):
    """What a PUSH is made of (the broker's stored messages are pushable as they are;
    their ``accepted_at``, on ``Outbox.clock``, gives the PUSH its age; a relayed
    ``PushRow`` carries its ``age_ms``)."""

    @property
    def guid(self) -> bytes:
        """The producer's 16-byte GUID."""
        ...

    @property
    def payload(self) -> bytes:
        """The message body."""
        ...

    @property
    def properties(self) -> Mapping[str, str]:
        """The message's properties (empty if none)."""
        ...


class AckGroup:
    """The ACKs of one PutBatch frame, in PUT order; ``ready`` once they are final."""

    __slots__ = ("acks", "ready")

    def __init__(self) -> None:
        self.acks: list[AckEntry] = []
        self.ready = False


class _Framed:
    """A frame to send as it is (HelloReply, Response, Error)."""

    __slots__ = ("frame", "holds_pushes", "size")

    def __init__(self, frame: pb.ServerFrame, holds_pushes: bool) -> None:
        self.frame = frame
        self.holds_pushes = holds_pushes
        self.size = frame.ByteSize()


class Outbox:
    """Everything one session has to send, in the order it must be sent."""

    def __init__(self, max_frame_bytes: int, read_bound_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        """Coalescing stops once a frame is about this big (a bigger item goes alone)."""
        self.read_bound_bytes = read_bound_bytes
        """The session stops reading while the ordered lane holds more than this."""
        self._ordered: deque[AckGroup | _Framed] = deque()
        self._ordered_bytes = 0
        self._pushes: list[tuple[int, Pushable, int]] = []
        self._push_bytes = 0
        self._push_turn = False
        self._push_holds = 0
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False
        """Nothing more will be sent: new items are dropped."""
        self.finishing = False
        """The session is ending: no more PUSHes, the ordered lane drains."""
        self.clock: Callable[[], float] | None = None
        """The clock ``accepted_at`` is on (the broker's): PUSHes carry their age on it.
        None (a proxy relaying upstream PUSHes as they came): no age is added."""
        self.revoked = RevokedDeliveries()
        """The deliveries ``revoke`` told the client of: refusing their CONFIRMs is no
        fault of the client's (``holdfast.server.revoked``)."""

    # -- producers ------------------------------------------------------------------

    def send(self, frame: pb.ServerFrame, holds_pushes: bool = False) -> None:
        """Queue ``frame`` in the ordered lane. With ``holds_pushes`` no PUSH is written
        before it (the Response that opens a consumer's queue handle)."""
        if self.closed:
            return
        item = _Framed(frame, holds_pushes)
        self._push_holds += holds_pushes
        self._ordered.append(item)
        self._grow(item.size)
        if len(self._ordered) == 1:
            self._work.set()

    def add_acks(self, group: AckGroup) -> None:
        """Queue the ACKs of one PUT batch in the ordered lane; they leave once
        ``group.ready`` is set and ``acks_ready(group)`` is called."""
        if self.closed or not group.acks:
            return  # an empty PutBatch: nothing to answer
        self._ordered.append(group)
        self._grow(len(group.acks) * (GUID_BYTES + _ACK_OVERHEAD))
        if group.ready and len(self._ordered) == 1:
            self._work.set()

    def acks_ready(self, group: AckGroup) -> None:
        """``group`` is final; wake the writer if it was what the ordered lane waited on."""
        group.ready = True
        if self._ordered and self._ordered[0] is group:
            self._work.set()

    def push(self, queue_id: int, message: Pushable, delivery_count: int) -> None:
        """Queue a PUSH of ``message`` under handle ``queue_id``."""
        if self.closed or self.finishing:
            return
        self._pushes.append((queue_id, message, delivery_count))
        self._push_bytes += len(message.payload) + _PUSH_OVERHEAD
        self._work.set()

    def push_rows(self, queue_id: int, rows: list[PushRow]) -> None:
        """``push`` for a run of relayed PUSHes of handle ``queue_id``, each with its own
        delivery count."""
        if self.closed or self.finishing or not rows:
            return
        self._pushes += [(queue_id, row, row.delivery_count) for row in rows]
        self._push_bytes += sum(map(len, map(_payload_of, rows))) + _PUSH_OVERHEAD * len(rows)
        self._work.set()

    def drop_pushes(self, queue_id: int) -> None:
        """Forget the PUSHes not yet written for handle ``queue_id`` (it was closed and
        its messages went back to the queue)."""
        kept = [p for p in self._pushes if p[0] != queue_id]
        if len(kept) != len(self._pushes):
            self._pushes = kept
            self._push_bytes = sum(len(m.payload) + _PUSH_OVERHEAD for _, m, _ in kept)

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        """The deliveries ``guids`` under ``queue_id`` are void: PUSHes of the handle not
        written yet are dropped, and the client is told which (``DELIVERIES_REVOKED``),
        after the PUSHes already written. Their refused CONFIRMs are not counted
        against the client (``revoked``)."""
        self.drop_pushes(queue_id)
        if not self.closed:
            self.revoked.add(queue_id, guids)
        error = pb.Error(
            status=pb.STATUS_DELIVERIES_REVOKED,
            message="the broker node lost its lease on the store: these deliveries are "
            "void (CONFIRMs refused) and will be delivered again",
            queue_id=queue_id,
            guids=guids,
        )
        self.send(pb.ServerFrame(error=error))

    def finish(self) -> None:
        """The session is ending: drop PUSHes not written yet (their consumers are gone)
        and let the writer finish once the ordered lane is empty."""
        self.finishing = True
        self._pushes = []
        self._push_bytes = 0
        self._work.set()

    def close(self) -> None:
        """Drop everything: the stream is gone."""
        self.closed = True
        self._ordered.clear()
        self.revoked.clear()
        self._pushes = []
        self._ordered_bytes = self._push_bytes = self._push_holds = 0
        self._room.set()
        self._work.set()

    # -- state ----------------------------------------------------------------------

    @property
    def ordered_bytes(self) -> int:
        """Approximate bytes waiting in the ordered lane."""
        return self._ordered_bytes

    @property
    def push_bytes(self) -> int:
        """Approximate bytes of PUSHes waiting."""
        return self._push_bytes

    @property
    def ordered_pending(self) -> bool:
        """Whether the ordered lane still holds anything (ready or not)."""
        return bool(self._ordered)

    def _grow(self, size: int) -> None:
        self._ordered_bytes += size
        if self._ordered_bytes > self.read_bound_bytes:
            self._room.clear()

    def _shrink(self, size: int) -> None:
        self._ordered_bytes -= size
        # Resume reading at half the bound, not just below it, so that reading does
        # not flap on and off with every frame written.
        if self._ordered_bytes <= self.read_bound_bytes // 2:
            self._room.set()

    @property
    def has_room(self) -> bool:
        """Whether the session may read more client frames now."""
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        """Return once the ordered lane is small enough to read more client frames."""
        await self._room.wait()

    async def wait_for_work(self) -> None:
        """Return once there may be a frame to take (or the outbox was closed)."""
        await self._work.wait()

    # -- the writer's side ----------------------------------------------------------

    def take(self) -> pb.ServerFrame | None:
        """The next frame to write, or ``None`` if nothing can be sent now (then
        ``wait_for_work()``). Frames are written one at a time in the order taken.
        Ordered frames and push batches take turns so neither lane starves the other."""
        self._work.clear()
        if self.closed:
            return None
        ordered_ready = bool(self._ordered) and self._ready(self._ordered[0])
        pushes_ready = bool(self._pushes) and not self._push_holds
        if pushes_ready and (self._push_turn or not ordered_ready):
            self._push_turn = False
            if ordered_ready:
                self._work.set()
            return self._take_pushes()
        if ordered_ready:
            self._push_turn = True
            if self._pushes:
                self._work.set()
            return self._take_ordered()
        return None

    @staticmethod
    def _ready(item: AckGroup | _Framed) -> bool:
        return not isinstance(item, AckGroup) or item.ready

    def _take_ordered(self) -> pb.ServerFrame:
        ordered = self._ordered
        head = ordered.popleft()
        if isinstance(head, _Framed):
            self._push_holds -= head.holds_pushes
            self._shrink(head.size)
            self._wake_if_ready()
            return head.frame
        # Whole groups are joined into one ACK batch: columns, no object per ACK.
        rows: list[AckEntry] = []
        size = 0
        group: AckGroup | _Framed = head
        while True:
            assert isinstance(group, AckGroup)
            rows += group.acks
            size += len(group.acks) * (GUID_BYTES + _ACK_OVERHEAD)
            if size >= self.max_frame_bytes or not ordered:
                break
            group = ordered[0]
            if not isinstance(group, AckGroup) or not group.ready:
                break
            ordered.popleft()
        self._shrink(size)
        self._wake_if_ready()
        return pb.ServerFrame(acks=ack_batch(rows))

    def _wake_if_ready(self) -> None:
        if self._ordered and self._ready(self._ordered[0]):
            self._work.set()

    def _take_pushes(self) -> pb.ServerFrame:
        pushes = self._pushes
        now = self.clock() if self.clock is not None else None
        limit = self.max_frame_bytes
        size = 0
        taken = 0
        queue_ids: list[int] = []
        guids: list[bytes] = []
        payloads: list[bytes] = []
        counts: list[int] = []
        ages: list[int] = []
        properties: list[tuple[int, Mapping[str, str]]] = []
        for queue_id, message, delivery_count in pushes:
            if taken and (size >= limit or taken >= MAX_PUSHES_PER_FRAME):
                break
            payload = message.payload
            queue_ids.append(queue_id)
            guids.append(message.guid)
            payloads.append(payload)
            counts.append(delivery_count)
            if now is None:
                # Relayed as it came (the proxy): the broker's age, unchanged.
                ages.append(getattr(message, "age_ms", 0))
            else:
                age = int((now - getattr(message, "accepted_at", now)) * 1000)
                ages.append(age if age > 0 else 0)
            if message.properties:
                properties.append((taken, message.properties))
            size += len(payload) + _PUSH_OVERHEAD
            taken += 1
        if taken == len(pushes):
            self._pushes = []
        else:
            del pushes[:taken]
            self._work.set()
        self._push_bytes -= size
        batch = push_batch(queue_ids, guids, payloads, counts, ages, properties)
        return pb.ServerFrame(pushes=batch)

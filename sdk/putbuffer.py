"""Rule 2's buffer: every posted PUT, by GUID in post order, until it is reported.

Also the PUTs the broker pushed back (``STATUS_HISTORY_FULL`` or ``QUEUE_FULL``: not
taken *yet*),
which stay buffered and are retransmitted on a back-off timer, and the age rule:
a PUT's age runs from its first post, on each hop's monotonic clock, and travels
on the wire as ``Put.age_ms`` so that no hop restarts it (``holdfast.sdk.frames``
writes it; ``SessionEngine.relay`` back-dates a relayed PUT by the age it arrived
with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from holdfast.sdk.putsegments import Segments
from holdfast.sdk.segment import Extra, Segment
from holdfast.sdk.types import Ack

PendingPut = tuple[
    bytes, int, bytes | memoryview, dict[str, str] | None, Callable[[Ack], Any] | None, float, int
]
"""A PUT on its way to the wire, or taken out of the buffer: ``(guid, queue_id, payload,
properties, on_ack, posted_at, size)``, read with the index constants below; the payload of
a PUT taken out of a full segment is a view of it (``Segment.payload``).
``posted_at`` is on the engine's monotonic clock, back-dated by the age a relayed PUT
arrived with.

The buffer itself keeps no such tuple (``holdfast.sdk.putsegments`` packs its PUTs);
it makes one when a PUT is sent again or reported. A plain tuple on purpose: the
garbage collector stops tracking a tuple that holds only bytes, strings, numbers, None
and str-to-str dicts, so the ones in the outbound queue cost its full collections
nothing (a class instance with ``__slots__`` is always tracked).
"""

GUID: Final = 0
QUEUE_ID: Final = 1
PAYLOAD: Final = 2
PROPERTIES: Final = 3
ON_ACK: Final = 4
POSTED_AT: Final = 5
SIZE: Final = 6

PUT_OVERHEAD = 40
"""Bytes a PUT costs on the wire besides payload and properties (GUID, tags, lengths)."""

RETRY_INITIAL = 0.05
RETRY_MAXIMUM = 1.0
"""Back-off, in seconds, before a pushed-back PUT is sent again (doubling per push-back)."""


def retransmit_margin(window: float) -> float:
    """Safety margin taken off the dedup window before retransmitting a PUT.

    A retransmit still has to travel; the broker refuses (``TOO_OLD``) what arrives
    older than its window, so sending one that will surely be refused is waste.
    """
    return min(window * 0.1, 2.0)


class PutBuffer:
    """Pending PUTs in post order, their byte count, and the pushed-back ones.

    ``keyed``: find PUTs by a dict, not by bisecting the sorted GUID column — for a
    proxy, whose clients' GUIDs interleave (``putsegments``)."""

    __slots__ = (
        "_held",
        "_retry_at",
        "_retry_delay",
        "busy",
        "bytes",
        "held",
        "keyed",
        "segments",
    )

    def __init__(self, keyed: bool = False) -> None:
        self.segments = Segments(keyed)
        self.keyed = keyed
        """A proxy's buffer, sent again by ``holdfast.sdk.resend`` after an outage."""
        """The PUTs themselves, packed; the ACK loop works on them directly."""
        self.bytes = 0
        """Wire bytes of the pending PUTs (payload, properties and overhead)."""
        self._held: dict[int, int] = {}
        self.held = self._held
        """Pushed-back PUTs (``seq`` -> queue id), waiting for their retry."""
        self.busy: set[int] = set()
        """Queues the broker pushed back on, from the push-back until a PUT of theirs gets
        an outcome (or the link drops): ``post()`` waits while its queue is here. Kept
        apart from ``held``, which empties while a retry is on the wire."""
        self._retry_at: float | None = None
        self._retry_delay = RETRY_INITIAL

    def __len__(self) -> int:
        return self.segments.count

    def __contains__(self, guid: object) -> bool:
        return isinstance(guid, bytes) and self.segments.find(guid) >= 0

    def add(
        self,
        guid: bytes,
        queue_id: int,
        payload: bytes,
        properties: dict[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        posted_at: float,
        size: int,
    ) -> None:
        """Buffer a PUT (its GUID not pending already) that counts for ``size`` bytes."""
        extra: Extra | None = None
        if properties is not None or on_ack is not None:
            extra = (properties, on_ack, size - len(payload) - PUT_OVERHEAD)
        self.segments.append(guid, queue_id, payload, posted_at, extra)
        self.bytes += size

    def __iter__(self) -> Iterator[PendingPut]:
        """The pending PUTs in post order (safe to pop while iterating)."""
        for segment in list(self.segments.order):
            live = segment.live
            for i in range(len(segment)):
                if live[i]:
                    yield pending_put(segment, i)

    def locate(self, guid: bytes) -> tuple[int, Segment, int] | None:
        """The ``seq``, segment and index of the pending PUT with this GUID, or None."""
        segments = self.segments
        seq = segments.find(guid)
        place = None if seq < 0 else segments.at(seq)
        return None if place is None else (seq, *place)

    def get(self, guid: bytes) -> PendingPut | None:
        """The pending PUT with this GUID, left in the buffer (None if not pending)."""
        found = self.locate(guid)
        return None if found is None else pending_put(found[1], found[2])

    def pop(self, guid: bytes) -> PendingPut | None:
        """Take a PUT out of the buffer (None if it is not pending)."""
        found = self.locate(guid)
        if found is None:
            return None
        seq, segment, i = found
        put = pending_put(segment, i)
        self.bytes -= put[SIZE]
        self._held.pop(seq, None)
        self.segments.release(segment, i)
        return put

    def of_queue(self, queue_id: int) -> list[PendingPut]:
        """The pending PUTs of one queue, in post order."""
        return [put for put in self if put[QUEUE_ID] == queue_id]

    # ------------------------------------------------------------------ push-back

    def hold(self, guid: bytes, now: float, no_copy: bool = False) -> None:
        """The broker did not take this PUT yet: keep it, retry after the back-off.

        ``no_copy``: the answer says the broker holds no copy of it (``HISTORY_FULL``,
        ``QUEUE_FULL``: ``lifecycle.admit`` decides a replay before either, and any
        earlier copy is younger than this PUT's age, so still in the history). A copy
        can then come only of a later send, so the PUT's age starts again now: kept at
        its first post, the retries of a burst past the history's bound reached the
        window, were refused ``TOO_OLD`` and reported UNKNOWN, never enqueued."""
        found = self.locate(guid)
        if found is None:
            return
        seq, segment, i = found
        if no_copy:
            segment.posted[i] = now
        queue_id = segment.queue_ids[i]
        self._held[seq] = queue_id
        self.busy.add(queue_id)
        if self._retry_at is None:
            self._retry_at = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAXIMUM)

    def holds_queue(self, queue_id: int) -> bool:
        """True while the broker pushes back on this queue's PUTs (``busy``)."""
        return queue_id in self.busy

    @property
    def retry_at(self) -> float | None:
        """When the held PUTs are due again (None if nothing is held)."""
        return self._retry_at

    def take_due(self, now: float) -> list[PendingPut]:
        """The held PUTs, in post order, once their retry is due (they stay pending)."""
        if self._retry_at is None or now < self._retry_at:
            return []
        held = sorted(self._held)
        self._held.clear()
        self._retry_at = None
        places = (self.segments.at(seq) for seq in held)
        return [pending_put(*place) for place in places if place is not None]

    def taken(self) -> None:
        """The broker took a PUT again: the next push-back starts the back-off afresh."""
        if not self._held:
            self._retry_delay = RETRY_INITIAL

    def release_holds(self) -> None:
        """The link dropped: held PUTs are retransmitted by the restore like any other."""
        self._held.clear()
        self.busy.clear()
        self._retry_at = None
        self._retry_delay = RETRY_INITIAL


def pending_put(segment: Segment, i: int) -> PendingPut:
    """The PUT at index ``i`` of ``segment`` as a ``PendingPut`` (its payload copied)."""
    payload = segment.payload(i)
    properties: dict[str, str] | None = None
    on_ack: Callable[[Ack], Any] | None = None
    size = len(payload) + PUT_OVERHEAD
    if segment.extras:
        extra = segment.extras.get(i)
        if extra is not None:
            properties, on_ack, more = extra
            size += more
    guid = segment.guid(i)
    return (guid, segment.queue_ids[i], payload, properties, on_ack, segment.posted[i], size)

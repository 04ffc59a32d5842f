"""A queue's ready messages, packed in columns until they leave the ready queue.

Issue #33: a queued 100-B message cost 458 B of broker RSS as a ``StoredMessage``
(the object, its GUID and payload ``bytes``, a float, a digest int, a deque slot and
a ``live`` dict entry). A message waiting for its first delivery needs none of that:
a PUT batch joins the tail ``Segment`` of its queue, which keeps the GUIDs end to end
(16 B each), the payloads end to end with their end offsets (4 B), the acceptance
times (8 B) and the digests (8 B), and properties only for the messages that have
some: about 140 B for a 100-B message. A ``StoredMessage`` is made when a message
leaves the ready queue (delivered, purged, taken for a move, expired, or looked at
with ``ready[0]``); only then is it in the ``live`` dict.

Everything else stays an object, in the same FIFO as the segments: messages given
back (requeued, released, delayed), GUIDs of other lengths and messages with a
pickup TTL (their heap holds them). Those are bounded by consumer credit or rare.

A packed message has no per-message index (a dict entry alone costs more than the
message). A PUT learns whether a packed GUID is known from the queue's GUID history,
where the broker recorded it when it was accepted and keeps it for the history's
retention. A segment older than that is *aged*: its GUIDs join ``elders`` (a
``guidtable.PackedGuids``, ~30 B each), and a hit there is checked against the aged
segments, since elders keeps GUIDs whose messages have left (it is rebuilt once most
of it is stale).

Runs on the broker's event loop, as ``queues`` does: no locks.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import accumulate, islice

from holdfast.broker.guidtable import PackedGuids
from holdfast.broker.store import NO_PROPERTIES, StoredMessage
from holdfast.proto.policy import PICKUP_TTL

GUID = 16
"""Bytes of a packable GUID (the wire's)."""

SEGMENT_MESSAGES = 8192
"""Most messages a segment takes: its delivered prefix is freed only with the whole
segment, so this bounds what a partly consumed segment keeps for nothing."""

SEGMENT_BYTES = 1 << 20
"""A segment takes no more batches once its payloads pass this (same reason)."""

ELDER_SLACK = 4096
"""Stale elders tolerated beyond the aged messages still queued before a rebuild."""


def packable(message: StoredMessage) -> bool:
    """Whether ``message`` may wait in a segment: a 16-byte GUID, never delivered, and
    no pickup TTL (the pickup heap holds such messages by identity)."""
    properties = message.properties
    return (
        len(message.guid) == GUID
        and not message.delivery_count
        and not (properties and PICKUP_TTL in properties)
    )


class Segment:
    """Never-delivered messages of one queue in columns, in acceptance order; those
    before ``start`` have left."""

    __slots__ = (
        "age_key",
        "aged",
        "digests",
        "ends",
        "guids",
        "payloads",
        "properties",
        "start",
        "times",
        "uri",
    )

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.guids: bytes | bytearray = bytearray()
        self.payloads: bytes | bytearray = bytearray()
        self.ends = array("I")
        """Each payload's end offset in ``payloads``."""
        self.times = array("d")
        self.digests = array("q")
        self.properties: dict[int, Mapping[str, str]] = {}
        """Properties by message index, for the messages that have some."""
        self.start = 0
        self.age_key = float("inf")
        """At most the earliest acceptance time here or in any later segment: aging by
        it never ages a segment after the history has let go of its GUIDs."""
        self.aged = False
        """Its GUIDs are in ``elders``: it takes no more batches."""

    def __len__(self) -> int:
        return len(self.ends) - self.start

    def open(self, extra: int) -> bool:
        """Whether a batch of ``extra`` payload bytes may join."""
        return (
            not self.aged
            and len(self.ends) < SEGMENT_MESSAGES
            and len(self.payloads) < SEGMENT_BYTES
            and len(self.payloads) + extra < 1 << 32
        )

    def extend(self, messages: list[StoredMessage]) -> None:
        """Append never-delivered ``messages`` (``packable``) of this queue."""
        base = len(self.ends)
        payloads = [message.payload for message in messages]
        if not isinstance(self.guids, bytearray) or not isinstance(self.payloads, bytearray):
            self.guids, self.payloads = bytearray(self.guids), bytearray(self.payloads)
        self.guids += b"".join([message.guid for message in messages])
        self.payloads += b"".join(payloads)
        ends = accumulate(map(len, payloads), initial=self.ends[-1] if base else 0)
        next(ends)
        self.ends.extend(ends)
        self.times.extend([message.accepted_at for message in messages])
        self.digests.extend([message.digest for message in messages])
        for index, message in enumerate(messages, base):
            if message.properties:
                self.properties[index] = message.properties

    def seal(self) -> None:
        """No more batches: drop the spare room a bytearray keeps for growth."""
        self.guids, self.payloads = bytes(self.guids), bytes(self.payloads)

    def message(self, index: int) -> StoredMessage:
        """A new ``StoredMessage`` for the message at ``index``."""
        end = self.ends[index]
        begin = self.ends[index - 1] if index else 0
        at = index * GUID
        return StoredMessage(
            self.uri,
            bytes(self.guids[at : at + GUID]),
            bytes(self.payloads[begin:end]),
            self.properties.get(index, NO_PROPERTIES),
            self.times[index],
            0,
            self.digests[index],
        )

    def pop(self) -> StoredMessage:
        """Take the last message out."""
        index = len(self.ends) - 1
        message = self.message(index)
        self.guids = self.guids[: index * GUID]
        self.payloads = self.payloads[: self.ends[index - 1] if index else 0]
        del self.ends[index], self.times[index], self.digests[index]
        self.properties.pop(index, None)
        return message

    def index_of(self, guid: bytes) -> int:
        """The index of ``guid`` among the messages still here, or -1."""
        guids = self.guids
        at = guids.find(guid, self.start * GUID)
        while at >= 0:
            if at % GUID == 0:
                return at // GUID
            at = guids.find(guid, at + 1)
        return -1

    def guid_list(self) -> list[bytes]:
        """The GUIDs still here."""
        guids = bytes(self.guids)
        return [guids[at : at + GUID] for at in range(self.start * GUID, len(guids), GUID)]


class ReadyMessages:
    """The ready FIFO: ``StoredMessage`` s and ``Segment`` s, used as a deque of
    ``StoredMessage``. A packed message taken out is made an object and joins
    ``objects`` (the queue's live messages by GUID). Iteration yields new objects for
    packed messages (views: changing them changes nothing here)."""

    __slots__ = ("_aged_live", "_count", "_elders", "_items", "_objects", "_unaged", "packed")

    def __init__(self, objects: dict[bytes, StoredMessage]) -> None:
        self._objects = objects
        self._items: deque[StoredMessage | Segment] = deque()
        self._count = 0
        self.packed = 0
        """Messages in segments (live, but not in ``objects``)."""
        self._unaged: deque[Segment] = deque()
        """Segments not aged yet, in the order they were made."""
        self._elders: PackedGuids | None = None
        self._aged_live = 0
        """Messages still in aged segments."""

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[StoredMessage]:
        for item in self._items:
            if isinstance(item, Segment):
                for index in range(item.start, len(item.ends)):
                    yield item.message(index)
            else:
                yield item

    def __getitem__(self, index: int) -> StoredMessage:
        """``[0]`` turns a packed head into an object in place; other indexes are views."""
        if index == 0 and self._count:
            head = self.popleft()
            self._items.appendleft(head)
            self._count += 1
            return head
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("ready index out of range")
        return next(islice(self, index, None))

    def pack(self, messages: list[StoredMessage]) -> None:
        """Append newly accepted ``packable`` messages, all accepted at or after the
        time their queue's history recorded them from."""
        items = self._items
        tail = items[-1] if items else None
        extra = sum(len(message.payload) for message in messages)
        if not isinstance(tail, Segment) or not tail.open(extra):
            if self._unaged and not self._unaged[-1].aged:
                self._unaged[-1].seal()
            tail = Segment(messages[0].queue_uri)
            items.append(tail)
            self._unaged.append(tail)
        tail.extend(messages)
        self._count += len(messages)
        self.packed += len(messages)
        earliest = min(message.accepted_at for message in messages)
        # Batches finish their store writes out of order: keep age keys non-decreasing.
        for segment in reversed(self._unaged):
            if segment.age_key <= earliest:
                break
            segment.age_key = earliest

    def append(self, message: StoredMessage) -> None:
        """Append an object (already in ``objects``)."""
        self._items.append(message)
        self._count += 1

    def extendleft(self, messages: Iterable[StoredMessage]) -> None:
        """Put objects (already in ``objects``) at the front, as ``deque.extendleft``."""
        for message in messages:
            self._items.appendleft(message)
            self._count += 1

    def popleft(self) -> StoredMessage:
        """Take the first message out."""
        items = self._items
        head = items[0]
        self._count -= 1
        if not isinstance(head, Segment):
            items.popleft()
            return head
        message = head.message(head.start)
        head.start += 1
        if head.start == len(head.ends):
            items.popleft()
            # An emptied segment must not wait in _unaged with its buffers.
            if self._unaged and self._unaged[0] is head:
                self._unaged.popleft()
        self._unpacked(head, message)
        return message

    def pop(self) -> StoredMessage:
        """Take the last message out."""
        items = self._items
        tail = items[-1]
        self._count -= 1
        if not isinstance(tail, Segment):
            items.pop()
            return tail
        message = tail.pop()
        if not len(tail):
            items.pop()
            if self._unaged and self._unaged[-1] is tail:
                self._unaged.pop()
        self._unpacked(tail, message)
        return message

    def _unpacked(self, segment: Segment, message: StoredMessage) -> None:
        self.packed -= 1
        if segment.aged:
            self._aged_live -= 1
        self._objects[message.guid] = message

    def remove(self, message: StoredMessage) -> None:
        """Remove the object ``message`` (by identity); ``ValueError`` if not here."""
        for position, item in enumerate(self._items):
            if item is message:
                del self._items[position]
                self._count -= 1
                return
        raise ValueError("message not in the ready queue")

    def drain(self) -> list[StoredMessage]:
        """Take every message out, in order (packed ones join ``objects``)."""
        taken = [self.popleft() for _ in range(self._count)]
        self._unaged.clear()
        self._elders = None
        return taken

    def clear(self) -> None:
        """Take every message out; they stay live, as a deque's would stay in ``live``."""
        self.drain()

    def find(self, guid: bytes) -> StoredMessage | None:
        """A view of the packed message with ``guid``, if any: a scan, for rare paths."""
        if self.packed:
            for item in self._items:
                if isinstance(item, Segment) and (index := item.index_of(guid)) >= 0:
                    return item.message(index)
        return None

    def packed_guids(self) -> Iterator[bytes]:
        """The GUIDs of the packed messages."""
        for item in self._items:
            if isinstance(item, Segment):
                yield from item.guid_list()

    def aged_digest(self, guid: bytes, horizon: float) -> int | None:
        """The digest of a packed message with ``guid`` that the history may have let
        go of: one accepted before ``horizon`` (now less the history's retention)."""
        unaged = self._unaged
        while unaged and unaged[0].age_key <= horizon:
            self._age(unaged.popleft())
        elders = self._elders
        if elders is None or (digest := elders.get(guid)) is None:
            return None
        for item in self._items:
            if isinstance(item, Segment) and item.aged and item.index_of(guid) >= 0:
                return digest
        return None

    def _age(self, segment: Segment) -> None:
        if not len(segment):
            return  # emptied already
        if segment is self._items[-1]:
            segment.seal()
        segment.aged = True
        self._aged_live += len(segment)
        elders = self._elders
        if elders is None or len(elders) > 2 * self._aged_live + ELDER_SLACK:
            elders = self._elders = PackedGuids()
            elders.begin(0)
            for item in self._items:
                if isinstance(item, Segment) and item.aged and item is not segment:
                    elders.add_new(item.guid_list(), item.digests.tolist()[item.start :])
        elders.add_new(segment.guid_list(), segment.digests.tolist()[segment.start :])
        elders.flush()


class LiveMessages:
    """Every message of a queue by GUID, ready, delayed or unconfirmed: ``objects``
    plus ``ready`` 's packed messages. Looking a packed GUID up is a scan (rare paths:
    dead letters arriving, moves); a PUT asks ``Queue.known_digest`` instead."""

    __slots__ = ("objects", "ready")

    def __init__(self, objects: dict[bytes, StoredMessage], ready: ReadyMessages) -> None:
        self.objects = objects
        self.ready = ready

    def __len__(self) -> int:
        return len(self.objects) + self.ready.packed

    def __bool__(self) -> bool:
        return bool(self.objects) or self.ready.packed > 0

    def __iter__(self) -> Iterator[bytes]:
        yield from list(self.objects)
        yield from self.ready.packed_guids()

    def __contains__(self, guid: object) -> bool:
        return isinstance(guid, bytes) and self.get(guid) is not None

    def __setitem__(self, guid: bytes, message: StoredMessage) -> None:
        self.objects[guid] = message

    def get(self, guid: bytes) -> StoredMessage | None:
        """The object for ``guid``, or a view of its packed message, or None."""
        message = self.objects.get(guid)
        return message if message is not None else self.ready.find(guid)

    def pop(self, guid: bytes, default: StoredMessage | None = None) -> StoredMessage | None:
        """Remove the object for ``guid`` (packed messages leave through ``ready``)."""
        return self.objects.pop(guid, default)

    def clear(self) -> None:
        """Forget every message (the queue is being deleted: purge it first)."""
        self.ready.drain()
        self.objects.clear()


__all__ = ["LiveMessages", "ReadyMessages", "Segment", "packable"]

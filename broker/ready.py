"""A queue's ready messages: objects and packed ``segments``, in one FIFO.

Most queued messages wait for their first delivery packed in a ``Segment`` (issue #33:
~140 B instead of ~460 B for a 100-B message). Objects are made, a few at a time, when
messages leave the ready queue (delivered, purged, taken for a move, expired, or
looked at with ``ready[0]``); only then are they in the ``live`` dict. Messages given
back (requeued, released, delayed), GUIDs of other lengths and messages with a pickup
TTL (its heap holds them) stay objects, in the same FIFO: those are bounded by
consumer credit, or rare.

A packed message has no per-message index (a dict entry alone costs more than the
message). A PUT learns whether a packed GUID is known from the queue's GUID history,
which recorded it when the broker accepted it and keeps it for its retention. A
segment older than that is *aged*: its GUIDs join ``elders`` (a ``guidtable``
``PackedGuids``, ~30 B each), and a hit there is checked against the aged segments,
since elders keeps the GUIDs of messages that left (it is rebuilt once mostly stale).

Runs on the broker's event loop, as ``queues`` does: no locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from operator import attrgetter

from holdfast.broker.dedup import GuidHistory
from holdfast.broker.guidtable import PackedGuids
from holdfast.broker.segments import GUID, INF, Segment
from holdfast.broker.store import StoredMessage
from holdfast.proto.policy import PICKUP_TTL

ELDER_SLACK = 4096
"""Stale elders tolerated beyond the aged messages still queued before a rebuild."""

_guid_of = attrgetter("guid")

TAKE = 32
"""Packed messages made objects at once when the head is taken (``Segment.take``)."""


class ReadyMessages:
    """The ready FIFO of ``StoredMessage`` s and ``Segment`` s, used as a deque of
    ``StoredMessage``. A packed message taken out is made an object and joins
    ``objects`` (the queue's live messages by GUID). Iterating makes new objects for
    packed messages: views, whose changes change nothing here."""

    __slots__ = (
        "_aged_live",
        "_count",
        "_elders",
        "_items",
        "_objects",
        "_unaged",
        "check_from",
        "packed",
    )

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
        self.check_from = INF
        """``aged_digest`` can find nothing for a horizon before this: a PUT skips it."""

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
        """``[0]`` makes a packed head an object in place; other indexes give views."""
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

    def pack(self, messages: list[StoredMessage]) -> bool:
        """Append newly accepted, never-delivered messages that their queue's history
        has recorded, unless one must stay an object (then False, nothing taken)."""
        guids = [message.guid for message in messages]
        if set(map(len, guids)) != {GUID}:
            return False
        properties = [message.properties for message in messages]
        if any(properties) and any(each and PICKUP_TTL in each for each in properties):
            return False
        payloads = [message.payload for message in messages]
        items = self._items
        tail = items[-1] if items else None
        if not isinstance(tail, Segment) or not tail.open(sum(map(len, payloads))):
            if self._unaged and not self._unaged[-1].aged:
                self._unaged[-1].seal()
            tail = Segment(messages[0].queue_uri)
            items.append(tail)
            self._unaged.append(tail)
        tail.extend(guids, payloads, messages, properties)
        self._count += len(messages)
        self.packed += len(messages)
        earliest = min(message.accepted_at for message in messages)
        # Batches finish their store writes out of order: keep age keys non-decreasing.
        for segment in reversed(self._unaged):
            if segment.age_key <= earliest:
                break
            segment.age_key = earliest
        self._recheck()
        return True

    def append(self, message: StoredMessage) -> None:
        """Append an object (already in ``objects``)."""
        self._items.append(message)
        self._count += 1

    def extendleft(self, messages: Iterable[StoredMessage]) -> None:
        """Put objects (already in ``objects``) in front, as ``deque.extendleft``."""
        for message in messages:
            self._items.appendleft(message)
            self._count += 1

    def popleft(self) -> StoredMessage:
        """Take the first message out (a packed head makes the next few objects)."""
        items = self._items
        head = items[0]
        self._count -= 1
        if not isinstance(head, Segment):
            items.popleft()
            return head
        taken = self._take_packed(head, TAKE)
        items.extendleft(reversed(taken[1:]))
        return taken[0]

    def take_front(self, count: int) -> list[StoredMessage]:
        """Take up to ``count`` messages from the front, in order, as objects: packed
        ones a segment's slice at a time (``popleft`` for a batch)."""
        items = self._items
        taken: list[StoredMessage] = []
        while items and len(taken) < count:
            head = items[0]
            if not isinstance(head, Segment):
                items.popleft()
                taken.append(head)
                continue
            taken += self._take_packed(head, count - len(taken))
        self._count -= len(taken)
        return taken

    def _take_packed(self, head: Segment, count: int) -> list[StoredMessage]:
        """Up to ``count`` messages of the head segment, made objects; an emptied head
        leaves the FIFO."""
        taken = head.take(count)
        if not len(head):
            self._items.popleft()
            # An emptied segment must not wait in _unaged with its buffers.
            if self._unaged and self._unaged[0] is head:
                self._unaged.popleft()
                self._recheck()
        self._unpacked(head, taken)
        return taken

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
                self._recheck()
        self._unpacked(tail, [message])
        return message

    def _unpacked(self, segment: Segment, messages: list[StoredMessage]) -> None:
        self.packed -= len(messages)
        if segment.aged:
            self._aged_live -= len(messages)
            if not self._aged_live:
                self._elders = None
                self._recheck()
        self._objects.update(zip(map(_guid_of, messages), messages, strict=True))

    def _recheck(self) -> None:
        unaged = self._unaged
        self.check_from = -INF if self._elders is not None else unaged[0].age_key if unaged else INF

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
        self._recheck()
        return taken

    def clear(self) -> None:
        """Take every message out; they stay live, as a deque's stayed in ``live``."""
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
        self._recheck()
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
    plus ``ready`` 's packed messages, known to ``history`` while they are packed. A
    PUT asks ``known_digest``; ``in`` and ``get`` scan the segments when ``history``
    or elders know a GUID (rare paths: dead letters arriving, moves)."""

    __slots__ = ("history", "objects", "ready")

    def __init__(
        self, objects: dict[bytes, StoredMessage], ready: ReadyMessages, history: GuidHistory
    ) -> None:
        self.objects = objects
        self.ready = ready
        self.history = history

    def known_digest(self, guid: bytes, now: float) -> int | None:
        """The digest of ``guid`` if its message lives or the history holds it. The
        history holds packed GUIDs for its retention (less a second's margin, here)."""
        message = self.objects.get(guid)
        if message is not None:
            return message.digest
        digest = self.history.get(guid)
        horizon = now - self.history.retention + 1.0
        if digest is None and horizon >= self.ready.check_from:
            return self.ready.aged_digest(guid, horizon)
        return digest

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
        if message is not None or not self.ready.packed:
            return message
        if self.known_digest(guid, self.history.clock()) is None:
            return None
        return self.ready.find(guid)

    def pop(self, guid: bytes, default: StoredMessage | None = None) -> StoredMessage | None:
        """Remove the object for ``guid`` (packed messages leave through ``ready``)."""
        return self.objects.pop(guid, default)

    def clear(self) -> None:
        """Forget every message (the queue is being deleted: purge it first)."""
        self.ready.drain()
        self.objects.clear()


__all__ = ["LiveMessages", "ReadyMessages"]

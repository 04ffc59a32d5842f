"""The packed storage behind ``PutBuffer``: buffered PUTs as columns, not objects.

A producer may buffer a million PUTs while disconnected. As one tuple per PUT (with
its GUID, payload and post time as objects of their own, and a dict entry to find it)
a buffered 100-byte PUT cost ~350 bytes of RSS; here it costs its bytes: PUTs are
appended to ``Segment``s (``holdfast.sdk.segment``) of ``SEGMENT_PUTS``, whose
columns hold the GUIDs end to end, the payloads end to end in one buffer, and the end
offsets, post times and queue ids as ``array``s. Properties and ``on_ack`` callbacks,
which most PUTs lack, are kept only for the PUTs that have them. A segment is dropped
once all its PUTs are reported.

A PUT is named by its *sequence number* (``seq``): its place in post order, which
also tells its segment (``seq >> SEGMENT_SHIFT``) and its index there. Nothing maps a
GUID to its PUT: the GUIDs a session makes are uuid7s, strictly increasing in post
order (``holdfast.sdk.guids``), so the GUID column, read across segments, is sorted
and an ACK's GUID is found by bisection (``Segments.find``); ACKs mostly come in post
order, so the place after the last one found is tried first. A GUID that would break
the order (one given by the caller, or a proxy's client's) is a *stray*: the column
repeats the previous GUID in its place, to stay sorted, and a small dict finds it.

A proxy relays many clients' uuid7s, which interleave (at 300 sessions half were
strays, and each ACK took the search): its segments are *keyed* (``keyed=True``), the
column keeps each GUID as it came and a dict finds it; ACK runs still match whole.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import accumulate, islice
from operator import attrgetter, lt

from holdfast.sdk.segment import Extra, Segment

SEGMENT_SHIFT = 12
SEGMENT_PUTS = 1 << SEGMENT_SHIFT
"""PUTs per segment: small enough that a reported-out segment frees its memory soon,
large enough that a million PUTs are a few hundred objects."""

SEGMENT_BYTES = 1 << 22
"""Payload bytes past which a segment takes no more PUTs (its ``seq`` numbers left
unused): a segment is kept while any of its PUTs is pending, so 4,096 PUTs of 16 KiB
(64 MiB) stayed for one of them, and a proxy at its 256 MiB bound held several such."""

_MASK = SEGMENT_PUTS - 1
_ONES = b"\x01" * SEGMENT_PUTS


_last_of = attrgetter("last")


class Segments:
    """Buffered PUTs in post order, in segments, found by GUID without a map of them."""

    __slots__ = (
        "_before_tail",
        "_by_number",
        "_cursor",
        "_keyed",
        "_last",
        "_released",
        "_strays",
        "order",
        "tail",
    )

    def __init__(self, keyed: bool = False) -> None:
        self._keyed = keyed
        """Every GUID found by the dict (``_strays``), none by bisection (a relay)."""
        self._last = b""
        """The last GUID in the column (strays aside): a GUID above it is in order."""
        self.tail = Segment(0, b"", _ONES)
        """The segment PUTs are appended to."""
        self.order: list[Segment] = [self.tail]
        """The segments in post order (for the bisection and the walks in order)."""
        self._by_number: dict[int, Segment] = {0: self.tail}
        self._strays: dict[bytes, int] = {}
        """The strays' ``seq`` by GUID (when keyed, every pending PUT's)."""
        self._cursor = 0
        """Where the next ACK's PUT is likely to be: after the last one found."""
        self._before_tail = 0
        """PUTs appended to the segments before the tail."""
        self._released = 0
        """PUTs reported (a post counts none of these: it only appends to the tail)."""

    @property
    def count(self) -> int:
        """PUTs not reported yet."""
        return self._before_tail + len(self.tail.ends) - self._released

    def append(
        self,
        guid: bytes,
        queue_id: int,
        payload: bytes,
        posted_at: float,
        extra: Extra | None,
    ) -> None:
        """Buffer one PUT (the hot path of every post: as few steps as can be)."""
        segment = self.tail
        ends = segment.ends
        i = len(ends)
        if i == SEGMENT_PUTS or len(segment.data) >= SEGMENT_BYTES:
            segment = self._roll()
            ends = segment.ends
            i = 0
        if self._keyed:
            guids = segment.guids
            guids += guid
            self._strays[guid] = segment.base + i
        elif guid > self._last:
            self._last = guid
            guids = segment.guids
            guids += guid  # a bytearray: the tail is never frozen
        else:
            self._stray(segment, i, guid)
        data = segment.data
        data += payload
        ends.append(len(data))
        segment.posted.append(posted_at)
        segment.queue_ids.append(queue_id)
        if extra is not None:
            segment.extras[i] = extra

    def extend(
        self,
        guids: Sequence[bytes],
        queue_id: int,
        payloads: Sequence[bytes],
        posted: Sequence[float],
        extras: Mapping[int, Extra] | None = None,
    ) -> None:
        """``append`` for a run of one queue's PUTs (a proxy relaying a client's batch),
        ``extras`` by index in the run: column by column where the GUIDs are in order."""
        extras = extras or {}
        start = 0
        count = len(guids)
        while start < count:
            segment = self.tail
            room = SEGMENT_PUTS - len(segment.ends)
            if not room or len(segment.data) >= SEGMENT_BYTES:
                segment = self._roll()
                room = SEGMENT_PUTS
            end = min(count, start + room)
            budget = SEGMENT_BYTES - len(segment.data)
            if sum(map(len, payloads[start:end])) > budget:
                # Up to the PUT that reaches the budget (at least one): a segment lives
                # as long as any of its PUTs, so a big one would pin many payloads.
                sizes = accumulate(map(len, payloads[start:end]))
                end = start + 1 + sum(1 for size in islice(sizes, 1, None) if size <= budget)
            run = guids[start:end]
            whole = self._keyed or (run[0] > self._last and all(map(lt, run, islice(run, 1, None))))
            if self._keyed:
                first = segment.base + len(segment.ends)
                self._strays.update(zip(run, range(first, first + end - start), strict=True))
            elif whole:
                self._last = run[-1]
            if whole:
                segment.guids += b"".join(run)
                data = segment.data
                taken = payloads[start:end]
                segment.ends.extend(islice(accumulate(map(len, taken), initial=len(data)), 1, None))
                data += b"".join(taken)
                segment.posted.extend(posted[start:end])
                segment.queue_ids += array("I", (queue_id,)) * (end - start)
                shift = len(segment.ends) - end  # a run index's place in the segment
                segment.extras.update((j + shift, extras[j]) for j in extras if start <= j < end)
            else:
                for j in range(start, end):
                    self.append(guids[j], queue_id, payloads[j], posted[j], extras.get(j))
            start = end

    def _stray(self, segment: Segment, i: int, guid: bytes) -> None:
        segment.guids += self._last
        segment.strays[i] = guid
        self._strays[guid] = segment.base + i

    def _roll(self) -> Segment:
        """The tail is full (of PUTs or of bytes): freeze it (or drop it if nothing in it
        is pending)."""
        full = self.tail
        full.last = self._last
        if full.alive:
            full.freeze()
        else:
            self._drop(full)
        return self._new_tail(full.base + SEGMENT_PUTS, len(full.ends))

    def _new_tail(self, base: int, appended: int) -> Segment:
        """Start a tail at ``base`` after one of ``appended`` PUTs."""
        self._before_tail += appended
        segment = self.tail = Segment(base, self._last, _ONES)
        self.order.append(segment)
        self._by_number[base >> SEGMENT_SHIFT] = segment
        return segment

    def _drop(self, segment: Segment) -> None:
        self.order.remove(segment)
        del self._by_number[segment.base >> SEGMENT_SHIFT]

    def at(self, seq: int) -> tuple[Segment, int] | None:
        """The segment and index of a pending PUT (None if it was reported)."""
        segment = self._by_number.get(seq >> SEGMENT_SHIFT)
        if segment is None:
            return None
        i = seq & _MASK
        return None if i >= len(segment.ends) or not segment.live[i] else (segment, i)

    def find(self, guid: bytes) -> int:
        """The ``seq`` of the pending PUT with this GUID, or -1."""
        if self._keyed:
            seq = self._strays.get(guid, -1)
            if seq >= 0:  # a proxy's ACK runs match from here again (``match_run``)
                self._cursor = seq + 1
            return seq
        if self._strays and (stray := self._strays.get(guid)) is not None:
            return stray
        seq = self._cursor
        segment = self._by_number.get(seq >> SEGMENT_SHIFT)
        if segment is not None:
            i = seq & _MASK
            if (
                segment.guids[16 * i : 16 * i + 16] == guid
                and segment.live[i]
                and (not segment.strays or i not in segment.strays)
            ):
                self._cursor = seq + 1
                return seq
        order = self.order
        self.tail.last = self._last  # kept up to date here, not by every post
        k = bisect_left(order, guid, key=_last_of)
        if k == len(order):
            return -1
        segment = order[k]
        i = segment.first_at_or_after(guid)
        if i == len(segment.ends) or segment.guids[16 * i : 16 * i + 16] != guid:
            return -1
        if not segment.live[i] or (segment.strays and i in segment.strays):
            return -1  # reported, or a stray's place: the GUID it repeats was reported
        seq = segment.base + i
        self._cursor = seq + 1
        return seq

    def none_pending(self, guids: Sequence[bytes]) -> bool:
        """True if no GUID of ``guids`` is pending, nor twice in ``guids``."""
        if not guids:
            return True
        if self._strays and not self._strays.keys().isdisjoint(guids):
            return False
        # A run above the column's last GUID, increasing, is the usual case (a client's
        # uuid7s): settled without a search per GUID.
        if guids[0] > self._last and all(map(lt, guids, islice(guids, 1, None))):
            return True
        if len(set(guids)) != len(guids):
            return False
        find = self.find
        return all(find(guid) < 0 for guid in guids)

    def release(self, segment: Segment, i: int) -> None:
        """The PUT at ``i`` is reported: forget it (and its segment once it is empty)."""
        segment.live[i] = 0
        segment.dead += 1
        self._released += 1
        if self._keyed:
            del self._strays[bytes(segment.guids[16 * i : 16 * i + 16])]
        elif segment.strays:
            stray = segment.strays.pop(i, None)
            if stray is not None:
                del self._strays[stray]
        if segment.extras:
            segment.extras.pop(i, None)
        if segment.dead == len(segment.ends):
            self._emptied(segment)

    def _emptied(self, segment: Segment) -> None:
        """Every PUT of ``segment`` is reported: drop it, unless it is the tail."""
        if segment is not self.tail:
            self._drop(segment)
        elif not self.count:
            # Nothing is pending: start afresh, with a column that no stray disorders,
            # at the next segment boundary so that ``seq >> SEGMENT_SHIFT`` still finds it.
            self._drop(segment)
            self._last = b""
            self._new_tail(segment.base + SEGMENT_PUTS, len(segment.ends))

    def match_run(self, guids: bytes, start: int, count: int) -> tuple[Segment, int, int]:
        """ACKs in post order: how many of the ``count`` GUIDs at ``start`` in ``guids``
        (16 bytes each, end to end) are the pending PUTs at the cursor, in order, all in
        one segment; as ``(segment, index, how many)`` (0 if not even the first)."""
        seq = self._cursor
        segment = self._by_number.get(seq >> SEGMENT_SHIFT)
        if segment is None or segment.strays:
            return self.tail, 0, 0
        i = seq & _MASK
        n = min(count, len(segment.ends) - i)
        if n <= 0:
            return segment, i, 0
        if segment.guids[16 * i : 16 * (i + n)] != guids[16 * start : 16 * (start + n)]:
            return segment, i, 0
        if segment.live.find(0, i, i + n) >= 0:
            return segment, i, 0
        self._cursor = seq + n
        return segment, i, n

    def release_run(self, segment: Segment, i: int, n: int) -> None:
        """``release`` for the ``n`` PUTs from ``i``, all pending, none a stray."""
        segment.live[i : i + n] = bytes(n)
        segment.dead += n
        self._released += n
        if self._keyed:
            column = bytes(segment.guids[16 * i : 16 * (i + n)])
            for at in range(0, 16 * n, 16):
                del self._strays[column[at : at + 16]]
        extras = segment.extras
        if extras:
            for index in range(i, i + n):
                extras.pop(index, None)
        if segment.dead == len(segment.ends):
            self._emptied(segment)

"""A packed set of GUIDs with their content digests, for the dedup history.

A dict of GUID ``bytes`` to digest ``int`` cost 147 B per GUID (the bytes object, the
int, the dict slot and a bucket list slot). This table keeps a GUID in 26 B: a 25-byte
record (a 1-byte generation tag, the GUID's 16 bytes, its 8-byte digest) and a 1-byte
fingerprint (8 bits of the GUID's hash), in two arrays per partition (records in an
``array('B')``, which keeps less spare room than a ``bytearray``; fingerprints in a
``bytearray``). About 29 B per GUID allocated, 31-32 B of RSS (``bench/history.py``).

Partitions are found by linear hashing on the GUID's hash: one partition is split each
time the table passes ``RECORDS_PER_PARTITION`` records per partition, so growing
never rehashes the whole table at once (a stall of seconds at tens of millions of
GUIDs). Within a partition a lookup is ``in`` on the fingerprints (a ``memchr`` over
about 96 bytes, which answers most misses alone), then the GUID compared at each record
whose fingerprint matches. A lookup costs 3-5 times a dict's, about 0.5 us.

Expiry is by generation (the history's time buckets): records are appended in
generation order, so the expired records of a partition are a prefix of it. The
history tells the table which generations are alive (``oldest``..``newest``, at most
``MAX_GENERATIONS`` of them); an expired record is never answered, and is removed
when its partition is next appended to or swept. The history sweeps a slice of the
partitions whenever generations expire (all of them every ``SWEEP_GENERATIONS``), so
a record is gone long before its tag, counted modulo 256, could name a live
generation again.

GUIDs that are not 16 bytes (never on the wire: the broker refuses them first; only
in-process callers) live in a plain dict beside the table.
"""

from __future__ import annotations

import struct
from array import array

GUID_BYTES = 16
RECORD = 1 + GUID_BYTES + 8
"""Bytes of one record: generation tag, GUID, digest."""

RECORDS_PER_PARTITION = 96
"""Average records per partition: a split is made each time the table passes this.
Larger partitions cost less per GUID (two array headers) but more per lookup."""

MAX_GENERATIONS = 192
"""Most generations alive at once; a history joins its last bucket rather than pass it."""

SWEEP_GENERATIONS = 32
"""Every partition is swept within this many expired generations: with at most
``MAX_GENERATIONS`` alive, an expired record's tag is at most 192 + 32 + 1 < 256
generations behind the newest, so it can never be taken for a live one."""

TAG_MASK = 0xFF

_read = struct.Struct(">B16sq").unpack_from
"""(tag, GUID, digest) of the record at an offset: one C call, no slice made."""
_pack = struct.Struct(">B16sq").pack


class PackedGuids:
    """GUID -> 64-bit signed digest, in packed partitions, expired by generation."""

    __slots__ = (
        "_fingerprints",
        "_level",
        "_odd",
        "_records",
        "_split",
        "_sweep",
        "_tables",
        "newest",
        "oldest",
    )

    def __init__(self) -> None:
        self._tables: list[array[int]] = [array("B")]
        """Each partition's records."""
        self._fingerprints: list[bytearray] = [bytearray()]
        """Each partition's fingerprints, one per record, in the same order."""
        self._level = 0
        """The table has between 2**level and 2**(level+1) partitions."""
        self._split = 0
        """The next partition to split (linear hashing's split pointer)."""
        self._records = 0
        """Records in the partitions, expired ones not yet removed included."""
        self._sweep = 0
        self._odd: dict[bytes, tuple[int, int]] = {}
        """GUIDs of other lengths: (digest, generation tag)."""
        self.oldest = 0
        """The oldest generation alive."""
        self.newest = -1
        """The newest generation: new records are tagged with it."""

    def __len__(self) -> int:
        """Records held, expired ones not yet removed included."""
        return self._records + len(self._odd)

    def _alive(self, tag: int) -> bool:
        oldest = self.oldest
        return ((tag - oldest) & TAG_MASK) <= self.newest - oldest

    def get(self, guid: bytes) -> int | None:
        """The digest of ``guid`` if an alive record holds it."""
        # Once per PUT at the broker, so inlined and made of the cheapest calls: ``in``
        # (a memchr without argument parsing) answers most misses; bytearray.find and
        # startswith parse their arguments the slow way, ``_read`` does not.
        if len(guid) != GUID_BYTES:
            entry = self._odd.get(guid)
            return entry[0] if entry is not None and self._alive(entry[1]) else None
        code = hash(guid)
        level = self._level
        index = code & ((1 << level) - 1)
        if index < self._split:
            index = code & ((2 << level) - 1)
        fingerprints = self._fingerprints[index]
        mark = (code >> 32) & 0xFF
        if mark not in fingerprints:
            return None
        records = self._tables[index]
        oldest = self.oldest
        span = self.newest - oldest
        found = fingerprints.find(mark)
        while found >= 0:
            tag, held, digest = _read(records, found * RECORD)
            if held == guid and (tag - oldest) & 0xFF <= span:
                return int(digest)
            found = fingerprints.find(mark, found + 1)
        return None

    def add(self, guid: bytes, digest: int) -> bool:
        """Record ``guid`` in the newest generation; False if an alive record holds it
        already (then nothing changes)."""
        if len(guid) != GUID_BYTES:
            tag = self.newest & TAG_MASK
            entry = self._odd.get(guid)
            if entry is not None and self._alive(entry[1]):
                return False
            self._odd[guid] = (digest, tag)
            return True
        code = hash(guid)
        level = self._level
        index = code & ((1 << level) - 1)
        if index < self._split:
            index = code & ((2 << level) - 1)
        records = self._tables[index]
        oldest = self.oldest
        span = self.newest - oldest
        if records and (records[0] - oldest) & 0xFF > span:
            self._purge(index)
            records = self._tables[index]
        fingerprints = self._fingerprints[index]
        mark = (code >> 32) & 0xFF
        if mark in fingerprints:
            found = fingerprints.find(mark)
            while found >= 0:
                tag, held, _ = _read(records, found * RECORD)
                if held == guid and (tag - oldest) & 0xFF <= span:
                    return False
                found = fingerprints.find(mark, found + 1)
        records.frombytes(_pack(self.newest & TAG_MASK, guid, digest))
        fingerprints.append(mark)
        self._records += 1
        if self._records > RECORDS_PER_PARTITION * len(self._tables):
            self._split_one()
        return True

    def _purge(self, index: int) -> None:
        """Remove the expired prefix of partition ``index``."""
        records = self._tables[index]
        count = 0
        size = len(records)
        alive = self._alive
        while count * RECORD < size and not alive(records[count * RECORD]):
            count += 1
        if count:
            del records[: count * RECORD]
            del self._fingerprints[index][:count]
            self._records -= count

    def _split_one(self) -> None:
        """Linear hashing: split the partition at the split pointer in two by the next
        bit of the GUIDs' hashes."""
        index = self._split
        self._purge(index)
        old = self._tables[index]
        marks = self._fingerprints[index]
        bit = 1 << self._level
        # Each half is made at once, at its size, from views of the old records.
        view = memoryview(old)
        stay: list[memoryview] = []
        move: list[memoryview] = []
        stay_marks, move_marks = bytearray(), bytearray()
        for number, mark in enumerate(marks):
            start = number * RECORD
            if hash(_read(view, start)[1]) & bit:
                move.append(view[start : start + RECORD])
                move_marks.append(mark)
            else:
                stay.append(view[start : start + RECORD])
                stay_marks.append(mark)
        self._tables[index] = array("B", b"".join(stay))
        self._tables.append(array("B", b"".join(move)))
        del stay, move
        view.release()
        self._fingerprints[index] = stay_marks
        self._fingerprints.append(move_marks)
        self._split += 1
        if self._split == bit:
            self._level += 1
            self._split = 0

    def sweep(self, generations: int) -> None:
        """``generations`` expired: remove expired records from the next slice of
        partitions (and from the GUIDs of other lengths)."""
        tables = self._tables
        total = len(tables)
        count = min(total, -(-total * generations // SWEEP_GENERATIONS))
        cursor = self._sweep
        alive = self._alive
        for _ in range(count):
            if cursor >= total:
                cursor = 0
            records = tables[cursor]
            if records and not alive(records[0]):
                self._purge(cursor)
            cursor += 1
        self._sweep = cursor
        if self._odd:
            for guid in [g for g, (_, tag) in self._odd.items() if not alive(tag)]:
                del self._odd[guid]

    def clear(self) -> None:
        """Forget every record; the generations alive are none until the next one."""
        self._tables = [array("B")]
        self._fingerprints = [bytearray()]
        self._level = self._split = self._records = self._sweep = 0
        self._odd.clear()
        self.oldest = self.newest + 1


__all__ = ["MAX_GENERATIONS", "RECORD", "PackedGuids"]

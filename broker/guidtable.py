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

New GUIDs wait in a small dict (``YOUNG_GUIDS``) and are packed together (``flush``):
per GUID that costs a third of packing each one as it comes.

Expiry is by generation (the history's time buckets): records are appended in
generation order, so the expired records of a partition are a prefix of it. The
history tells the table which generations are alive (``oldest``..``newest``, at most
``MAX_GENERATIONS`` of them); an expired record is never answered, and is removed
when its partition is swept or split. The history sweeps a slice of the partitions
whenever generations expire (all of them every ``SWEEP_GENERATIONS``), so a record
is gone long before its tag, counted modulo 256, could name a live generation again.

Most lookups never reach a partition. uuid7 GUIDs begin with their time, so a new
GUID from a producer is almost always greater than every GUID the table holds, and the
table keeps the greatest it was ever given (``_top``): a GUID above it is unknown,
exactly, at the cost of one comparison. In a table of millions each partition
reached is a cache miss or two (fingerprints, then records); answering new GUIDs this
way took the broker's CPU per PUT from 14.1-15.3 to 9.5-12.4 us (one queue, a
history of 0.2-1.8M GUIDs; ``bench/PROFILE.md``). GUIDs out of that order (random
ones, a producer whose clock is behind) are looked up as before; expiry never lowers
``_top``.

GUIDs that are not 16 bytes (never on the wire: the broker refuses them first; only
in-process callers) live in a plain dict beside the table.
"""

from __future__ import annotations

import struct
from array import array
from itertools import compress, repeat

GUID_BYTES = 16
RECORD = 1 + GUID_BYTES + 8
"""Bytes of one record: generation tag, GUID, digest."""

RECORDS_PER_PARTITION = 96
"""Average records per partition: a split is made each time the table passes this.
Larger partitions cost less per GUID (two array headers) but more per lookup."""

MAX_GENERATIONS = 192
"""Most generations alive at once; a history joins its last bucket rather than pass it."""

SWEEP_GENERATIONS = 4
"""Every partition is swept within this many expired generations: expired records are
removed only by sweeps and splits, so they cost at most 4/128 more memory; and with at
most ``MAX_GENERATIONS`` alive, an expired record's tag is at most 192 + 4 + 1 < 256
generations behind the newest, so it can never be taken for a live one."""

SMALL_FLUSH = 8
"""Up to this many young GUIDs are packed one by one (``_flush_few``); more, by the
batch path. Measured per GUID on a table of 20k (2026-11-26): one GUID 2.2 us one by
one against 10.4 us by the batch path, equal at 8, the batch path ahead from 16."""

YOUNG_GUIDS = 1024
"""GUIDs kept in a dict before they are packed together (``flush``): the dict costs
about 100 B per GUID, so at most 0.1 MB per history."""

TAG_MASK = 0xFF

_read = struct.Struct(">B16sq").unpack_from
"""(tag, GUID, digest) of the record at an offset: one C call, no slice made."""
_pack = struct.Struct(">B16sq").pack
_each_record = struct.Struct(">B16sq").iter_unpack
_chunks = struct.Struct(f"{RECORD}s").iter_unpack


class PackedGuids:
    """GUID -> 64-bit signed digest, in packed partitions, expired by generation."""

    __slots__ = (
        "_fingerprints",
        "_grow_at",
        "_level",
        "_mask",
        "_odd",
        "_records",
        "_split",
        "_sweep",
        "_tables",
        "_top",
        "_young",
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
        self._mask = 0
        """2**level - 1: a hash's partition below the split pointer's round."""
        self._grow_at = RECORDS_PER_PARTITION
        """The record count at which the next partition is split."""
        self._split = 0
        """The next partition to split (linear hashing's split pointer)."""
        self._records = 0
        """Records in the partitions, expired ones not yet removed included."""
        self._sweep = 0
        self._odd: dict[bytes, tuple[int, int]] = {}
        """GUIDs of other lengths: (digest, generation tag)."""
        self._young: dict[bytes, int] = {}
        """The newest generation's latest GUIDs, not packed yet (``flush``)."""
        self._top = b""
        """No GUID added since the table was made or cleared is greater (``get``)."""
        self.oldest = 0
        """The oldest generation alive."""
        self.newest = -1
        """The newest generation: new records are tagged with it (``begin``)."""

    def __len__(self) -> int:
        """Records held, expired ones not yet removed included."""
        return self._records + len(self._odd) + len(self._young)

    def begin(self, generation: int) -> None:
        """Tag what is added from now on with ``generation`` (the next one)."""
        if self._young:
            self.flush()
        self.newest = generation

    def _alive(self, tag: int) -> bool:
        oldest = self.oldest
        return ((tag - oldest) & TAG_MASK) <= self.newest - oldest

    def get(self, guid: bytes) -> int | None:
        """The digest of ``guid`` if an alive record holds it."""
        # Once per PUT at the broker, so inlined and made of the cheapest calls: ``in``
        # (a memchr without argument parsing) answers most misses; bytearray.find and
        # startswith parse their arguments the slow way, ``_read`` does not.
        if guid > self._top and len(guid) == GUID_BYTES:
            return None  # greater than every GUID ever added: see the module docstring
        young = self._young.get(guid)
        if young is not None:
            return young
        if len(guid) != GUID_BYTES:
            entry = self._odd.get(guid)
            return entry[0] if entry is not None and self._alive(entry[1]) else None
        code = hash(guid)
        index = code & self._mask
        if index < self._split:
            index = code & (self._mask << 1 | 1)
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

    def add(self, guid: bytes, digest: int, known_new: bool = False) -> bool:
        """Record ``guid`` in the newest generation; False if an alive record holds it
        already (then nothing changes). ``known_new``: the caller has just looked it up
        and not found it, so it is not looked up again."""
        if not known_new and self.get(guid) is not None:
            return False
        if len(guid) != GUID_BYTES:
            self._odd[guid] = (digest, self.newest & TAG_MASK)
            return True
        if guid > self._top:
            self._top = guid
        young = self._young
        young[guid] = digest
        if len(young) >= YOUNG_GUIDS:
            self.flush()
        return True

    def add_new(self, guids: list[bytes], digests: list[int]) -> None:
        """``add(..., known_new=True)`` for every one of ``guids``, together."""
        young = self._young
        for guid, digest in zip(guids, digests, strict=True):
            if len(guid) != GUID_BYTES:
                self._odd[guid] = (digest, self.newest & TAG_MASK)
            else:
                young[guid] = digest
        # Odd lengths count too: get() needs an upper bound, not the exact greatest.
        # An empty batch changes nothing.
        top = max(guids, default=b"")
        if top > self._top:
            self._top = top
        if len(young) >= YOUNG_GUIDS:
            self.flush()

    def flush(self) -> None:
        """Pack the young GUIDs into their partitions, all at once.

        One PUT at a time, packing a GUID took about 13k instructions; in a batch the
        hashes, records and partition numbers are made by C loops (``map``, list
        comprehensions) and one short Python loop appends them."""
        young = self._young
        count = len(young)
        if not count:
            return
        while self._records + count > self._grow_at:
            self._split_one()
        if count <= SMALL_FLUSH:
            self._flush_few()
            return
        keys = list(young)
        digests = list(young.values())
        young.clear()
        codes = list(map(hash, keys))
        mask, split = self._mask, self._split
        wide = mask << 1 | 1
        indexes = [code & wide if code & mask < split else code & mask for code in codes]
        marks = [(code >> 32) & 0xFF for code in codes]
        packed = map(_pack, repeat(self.newest & TAG_MASK, count), keys, digests)
        tables, fingerprints = self._tables, self._fingerprints
        for index, record, mark in zip(indexes, packed, marks, strict=True):
            tables[index].frombytes(record)
            fingerprints[index].append(mark)
        self._records += count

    def _flush_few(self) -> None:
        """``flush`` of a few GUIDs, one by one: a new generation (``begin``) flushes
        what the last one left, and with thousands of open queues that is a GUID or two
        per queue each time, where the batch path's lists cost more than they save."""
        tag = self.newest & TAG_MASK
        mask, split = self._mask, self._split
        wide = mask << 1 | 1
        tables, fingerprints = self._tables, self._fingerprints
        for guid, digest in self._young.items():
            code = hash(guid)
            index = code & wide if code & mask < split else code & mask
            tables[index].frombytes(_pack(tag, guid, digest))
            fingerprints[index].append((code >> 32) & 0xFF)
        self._records += len(self._young)
        self._young.clear()

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
        data = self._tables[index].tobytes()
        marks = self._fingerprints[index]
        bit = 1 << self._level
        # Whole-partition C iterations (struct.iter_unpack, itertools.compress): a
        # Python loop over the records made splits a third of the cost of an add.
        moves = [hash(guid) & bit for _, guid, _ in _each_record(data)]
        stays = [not move for move in moves]
        chunks = [chunk for (chunk,) in _chunks(data)]
        self._tables[index] = array("B", b"".join(compress(chunks, stays)))
        self._tables.append(array("B", b"".join(compress(chunks, moves))))
        self._fingerprints[index] = bytearray(compress(marks, stays))
        self._fingerprints.append(bytearray(compress(marks, moves)))
        self._split += 1
        if self._split == bit:
            self._level += 1
            self._mask = (1 << self._level) - 1
            self._split = 0
        self._grow_at = RECORDS_PER_PARTITION * len(self._tables)

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
        self._level = self._mask = self._split = self._records = self._sweep = 0
        self._grow_at = RECORDS_PER_PARTITION
        self._odd.clear()
        self._young.clear()
        self._top = b""
        self.oldest = self.newest + 1


__all__ = ["MAX_GENERATIONS", "RECORD", "PackedGuids"]

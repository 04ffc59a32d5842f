"""Deterministic row GUIDs and batch digests for the Spark writers.

::

    GUID = uuid8(SHA-256(scheme tag, queue URI, run id, row key)[:16])

(RFC 9562 section 5.8, version 8 with the name-based SHA-256 construction of its
appendix B.2; version and variant bits overwritten, 122 bits of hash left.) A retried
task posts the same GUIDs again and the broker drops the replays.

The row key is either

- the value of a **key column** (canonical JSON, so ``1`` and ``"1"`` differ), which
  must be unique within the run: a repeat within a partition raises
  ``DuplicateRowKeyError`` at once; repeats across partitions are caught by the
  connector's commit, from the key fingerprints every task reports; or
- by default, a **content key**: the partition id, the row's content (canonical JSON
  with sorted keys) and its occurrence number among identical rows of the partition
  (#0, #1, ...). Identical rows are distinct rows: two copies in one partition, or in
  two partitions, get distinct GUIDs, so nothing is merged. The numbering does not
  depend on row order within the partition (Spark does not keep it after a shuffle),
  but it does depend on which partition holds a row: a retried task reads the same
  partition, and a replayed streaming batch is split the same way as long as its
  source, offsets, plan and partition settings are unchanged.

``BatchDigest`` sums ``SHA-256(GUID, payload)`` over rows (mod 2**128): independent of
row order and of how rows are spread over tasks, so tasks add their parts and the
driver adds the tasks'; it is recorded with the commit mark, so a replay with
different content is told from a plain replay.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.spark.rows import Record, canonical_json, row_values

GUID_SCHEME = b"holdfast.sdk.spark/guid/v2"
"""Hashed first into every GUID, so these GUIDs never meet another scheme's; a change
of scheme (or of the canonical row encoding) must change this tag. v2: content keys
include the partition id, so identical rows in different partitions stay distinct."""

KEY_FINGERPRINT_BYTES = 8
"""Bytes of a key's hash a task reports to the driver to find keys repeated across
partitions (a false alarm needs a 64-bit collision)."""

_KIND_CONTENT = b"c"
_KIND_COLUMN = b"k"

_VERSION_MASK = ~(0xF << 76) & ((1 << 128) - 1)
_VARIANT_MASK = ~(0x3 << 62) & ((1 << 128) - 1)
_VERSION_8_AND_VARIANT = (0x8 << 76) | (0b10 << 62)
_DIGEST_MODULUS = 1 << 128


class DuplicateRowKeyError(InvalidArgumentError):
    """Two rows of one run have the same ``key_column`` value.

    Both would get the same GUID and the broker would keep only the first, so the
    writer refuses instead of dropping a row silently. Choose a key that is unique
    per row (a retry fails the same way: fix the data or the key).
    """


def framed(data: bytes) -> bytes:
    """Length-prefixed, so that no two different field lists hash the same bytes."""
    return len(data).to_bytes(8, "big") + data


def uuid8(digest: bytes) -> uuid.UUID:
    """A version-8 UUID from the first 16 bytes of ``digest``."""
    value = int.from_bytes(digest[:16], "big")
    value = (value & _VERSION_MASK & _VARIANT_MASK) | _VERSION_8_AND_VARIANT
    return uuid.UUID(int=value)


def uuid8_bytes(digest: bytes) -> bytes:
    """``uuid8(digest).bytes`` without making the UUID: a Spark task's rows need only
    the 16 bytes (the version nibble is byte 6's high half, the variant byte 8's top
    two bits)."""
    return (
        digest[:6]
        + bytes(((digest[6] & 0x0F) | 0x80, digest[7], (digest[8] & 0x3F) | 0x80))
        + digest[9:16]
    )


class RowGuids:
    """Deterministic GUIDs for the rows of one partition (see the module docstring).

    One instance per partition attempt: it numbers identical rows (content keys) or
    remembers the keys it has seen (``key_column``), so it must see every row of the
    partition, each once. ``partition`` is the Spark partition id (content keys only).
    """

    def __init__(
        self,
        queue_uri: str,
        run_id: str | int,
        key_column: str | None = None,
        partition: int = 0,
    ) -> None:
        prefix = hashlib.sha256()
        for part in (GUID_SCHEME, queue_uri.encode(), str(run_id).encode()):
            prefix.update(framed(part))
        self._prefix = prefix
        self._key_column = key_column
        self._partition = partition.to_bytes(8, "big", signed=True)
        self._occurrences: dict[bytes, int] = {}
        self._seen: set[bytes] = set()

    @property
    def key_fingerprints(self) -> set[bytes]:
        """Fingerprints of the keys seen so far (``key_column`` only)."""
        return self._seen

    def for_row(self, row: Record, values: Mapping[str, Any] | None = None) -> uuid.UUID:
        """The GUID of the next row; ``values`` is ``row.asDict(recursive=True)`` if
        the caller already has it."""
        if self._key_column is not None:
            return self.for_key(row[self._key_column])
        return uuid.UUID(bytes=self.for_content(row, values))

    def for_content(self, row: Record, values: Mapping[str, Any] | None = None) -> bytes:
        """The GUID bytes of the next row by its content (no key column)."""
        if values is None:
            values = row_values(row)
        content = hashlib.sha256(canonical_json(values)).digest()[:16]
        occurrence = self._occurrences.get(content, 0)
        self._occurrences[content] = occurrence + 1
        hasher = self._prefix.copy()
        hasher.update(_KIND_CONTENT + self._partition + content + occurrence.to_bytes(8, "big"))
        return uuid8_bytes(hasher.digest())

    def for_key(self, key: Any) -> uuid.UUID:
        """The GUID of the row whose ``key_column`` holds ``key``; a key seen before in
        this partition raises ``DuplicateRowKeyError``."""
        return uuid.UUID(bytes=self.for_key_bytes(key))

    def for_key_bytes(self, key: Any) -> bytes:
        """``for_key(key).bytes``, without making the UUID."""
        if key is None:
            raise InvalidArgumentError(f"key column {self._key_column!r} is null in a row")
        hasher = self._prefix.copy()
        hasher.update(_KIND_COLUMN + canonical_json(key))
        digest = hasher.digest()
        marker = digest[:KEY_FINGERPRINT_BYTES]
        if marker in self._seen:
            raise DuplicateRowKeyError(
                f"key {repr(key)[:100]} of column {self._key_column!r} appears twice in one "
                "partition; the broker would keep only one of the rows"
            )
        self._seen.add(marker)
        return uuid8_bytes(digest)


class BatchDigest:
    """An order-independent digest of (GUID, payload) pairs; parts add up."""

    __slots__ = ("rows", "value")

    def __init__(self, value: int = 0, rows: int = 0) -> None:
        self.value = value
        self.rows = rows

    def add(self, guid: uuid.UUID, payload: bytes) -> None:
        """Count one row."""
        self.add_bytes(guid.bytes, payload)

    def add_bytes(self, guid: bytes, payload: bytes) -> None:
        """Count one row, by its GUID's 16 bytes."""
        digest = hashlib.sha256(guid + payload).digest()[:16]
        self.value = (self.value + int.from_bytes(digest, "big")) % _DIGEST_MODULUS
        self.rows += 1

    def merge(self, other: BatchDigest) -> None:
        """Add another part (another task's rows)."""
        self.value = (self.value + other.value) % _DIGEST_MODULUS
        self.rows += other.rows

    def to_bytes(self) -> bytes:
        """16 bytes, as recorded in a commit mark."""
        return self.value.to_bytes(16, "big")

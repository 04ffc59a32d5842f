"""Which write-ahead log batch holds a GUID: an index on the driver's local disk.

The exactly-once source must recognise a redelivery (``delivery_count`` > 1) of a
message that a batch in its log already holds. Keeping every such GUID in a Python set
grows the driver with the rows of ``walRetention`` batches; this index keeps them in a
SQLite file in a private temporary directory instead (rebuilt from the log's segments
when the reader starts, removed when it stops), so the driver's memory stays bounded
whatever the batch sizes. Lookups happen for redeliveries only.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path


class GuidIndex:
    """GUID -> the end offset of the log batch that holds it."""

    def __init__(self) -> None:
        # Used from Spark's thread and the SDK's dispatcher thread: one at a time.
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="holdfast-wal-index-")
        # Private to this process and rebuilt at every start: no fsync needed.
        self._db = sqlite3.connect(
            str(Path(self._dir) / "guids.sqlite"), check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE guids (guid BLOB PRIMARY KEY, start INTEGER, end INTEGER)")

    def add(self, start: int, end: int, guids: Iterable[uuid.UUID]) -> None:
        """Record that batch ``start..end`` holds ``guids``."""
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO guids VALUES (?, ?, ?)",
                [(guid.bytes, start, end) for guid in guids],
            )

    def batch_of(self, guid: uuid.UUID) -> tuple[int, int] | None:
        """The ``(start, end)`` of the batch that holds ``guid`` (None: none does)."""
        with self._lock:
            row = self._db.execute(
                "SELECT start, end FROM guids WHERE guid = ?", (guid.bytes,)
            ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def forget_through(self, end: int) -> None:
        """Drop the GUIDs of batches ending at or before ``end`` (pruned from the log)."""
        with self._lock:
            self._db.execute("DELETE FROM guids WHERE end <= ?", (end,))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM guids").fetchone()[0])

    def close(self) -> None:
        """Close and remove the index."""
        with self._lock:
            self._db.close()
        shutil.rmtree(self._dir, ignore_errors=True)

"""The driver's check for key-column values repeated across partitions, off the heap.

Each task reports the 8-byte fingerprints of its keys (unique within its partition:
``RowGuids`` refuses a repeat there at once). Counting repeats across partitions in a
Python set would grow the driver by ~100 bytes a row; they are counted in a SQLite
file in a private temporary directory instead, removed at once, so the driver's memory
stays bounded however many rows a version has.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from holdfast.sdk.spark.guids import KEY_FINGERPRINT_BYTES


def _split(data: bytes) -> Iterator[tuple[bytes]]:
    for start in range(0, len(data), KEY_FINGERPRINT_BYTES):
        yield (data[start : start + KEY_FINGERPRINT_BYTES],)


def count_repeats(parts: Iterable[bytes]) -> int:
    """How many fingerprints (concatenated per part) appeared in an earlier part."""
    directory = tempfile.mkdtemp(prefix="holdfast-keys-")
    try:
        db = sqlite3.connect(str(Path(directory) / "keys.sqlite"), isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("CREATE TABLE keys (fingerprint BLOB)")
            total = 0
            for data in parts:
                db.executemany("INSERT INTO keys VALUES (?)", _split(data))
                total += len(data) // KEY_FINGERPRINT_BYTES
            if total == 0:
                return 0
            (distinct,) = db.execute("SELECT count(DISTINCT fingerprint) FROM keys").fetchone()
            return total - int(distinct)
        finally:
            db.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)

"""Staged rows on disk, for a broker on a sqlite store: ``PATH-staging`` beside the store.

Every stage call's rows are written (and fsynced) before the call is answered, and an
attempt's rows are deleted when it leaves the book (published, discarded, expired), so
a broker restarted between a task's staging and its driver's commit still has them
(``StagingBook.restore`` loads them at start). Deadlines are on the broker's clock,
which resumes across restarts.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator

from holdfast.broker.staging import AttemptKey, StagedRow

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS staged (queue_uri TEXT, app_id TEXT, version INTEGER,"
    " partition INTEGER, attempt INTEGER, guid BLOB, payload BLOB, properties TEXT,"
    " deadline REAL, token TEXT NOT NULL DEFAULT 'anonymous',"
    " PRIMARY KEY (queue_uri, app_id, version, partition, attempt, guid))"
)
_KEY = "queue_uri = ? AND app_id = ? AND version = ? AND partition = ? AND attempt = ?"


def _key(key: AttemptKey) -> tuple[str, str, int, int, int]:
    return key.queue_uri, key.app_id, key.version, key.partition, key.attempt


class StagingFile:
    """The journal of a ``StagingBook`` in a SQLite file (full fsync on every change)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(staged)")}
            if "token" not in columns:
                # A file from before per-token limits: its rows count as anonymous.
                self._db.execute(
                    "ALTER TABLE staged ADD COLUMN token TEXT NOT NULL DEFAULT 'anonymous'"
                )
        except sqlite3.Error as error:
            raise OSError(f"cannot open the staging file {path}: {error}") from error

    def added(
        self, key: AttemptKey, rows: Iterable[StagedRow], deadline: float, token: str
    ) -> None:
        """``rows`` were staged under ``key`` by ``token``; ``key`` now ends at
        ``deadline``."""
        values = [
            (*_key(key), row.guid, row.payload, json.dumps(dict(row.properties)), deadline, token)
            for row in rows
        ]
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO staged VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values
            )
            self._db.execute(
                f"UPDATE staged SET deadline = ?, token = ? WHERE {_KEY}",
                (deadline, token, *_key(key)),
            )

    def removed(self, key: AttemptKey) -> None:
        """``key``'s rows left the book."""
        with self._lock:
            self._db.execute(f"DELETE FROM staged WHERE {_KEY}", _key(key))

    def load(self) -> Iterator[tuple[AttemptKey, StagedRow, float, str]]:
        """Every staged row, with its attempt, deadline and token."""
        with self._lock:
            found = self._db.execute(
                "SELECT queue_uri, app_id, version, partition, attempt, guid, payload,"
                " properties, deadline, token FROM staged"
            ).fetchall()
        for uri, app, version, part, attempt, guid, payload, props, deadline, token in found:
            key = AttemptKey(uri, app, version, part, attempt)
            row = StagedRow(bytes(guid), bytes(payload), json.loads(props))
            yield key, row, deadline, token

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()

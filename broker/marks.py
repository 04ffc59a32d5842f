"""Commit marks: what each writer application last committed on a queue, kept forever.

The GUID history protects replays for the dedup window only. A writer that replays a
whole batch later (a Spark streaming query restarted from its checkpoint after an
outage, a scheduler re-running a job) needs more: like Delta Lake's
``txnAppId``/``txnVersion``, the broker keeps, per ``(queue, application)``, the
latest committed version, a digest of what it wrote and its row count. The writer
reads the mark before it writes a version and skips a version already committed;
it records the mark once the version is complete. Marks are small (one per
application and queue) and never expire.

Rules of ``CommitMarkRequest`` (``record = true``):

* a version above the stored one replaces it;
* the stored version with the same digest is a replay: OK, nothing changes;
* the stored version with another digest is ``STATUS_CONFLICT``: the same batch was
  committed with different content, and the writer must fail loudly;
* a version below the stored one changes nothing (OK, the reply shows the newer mark).

Persistence: with ``--store memory`` marks live in the broker's memory. With
``--store sqlite:PATH`` they are kept in a SQLite file of their own beside the store,
``PATH-marks`` (the store holds an exclusive lock on its file), written and fsynced
before the reply. Being apart from the store, a mark is recorded after the rows of its
commit are stored; a commit cut off between the two left a record in the store, and
the broker records its mark at start (``restore``, by the same rules; see
``commit_records``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holdfast.broker.stores import parse_store_spec
from holdfast.proto import pb
from holdfast.proto.limits import MAX_APP_ID_BYTES
from holdfast.proto.validate import parse_queue_uri

log = logging.getLogger(__name__)

MAX_DIGEST_BYTES = 64
"""Longest digest accepted (a SHA-512)."""

QUOTE_LIMIT = 100
"""Characters of offending input quoted in an error reply."""


@dataclass(frozen=True, slots=True)
class Mark:
    """One application's latest committed version on one queue."""

    version: int
    digest: bytes
    rows: int
    committed_at: float


class MarkFile:
    """Marks in a SQLite file of their own; every write is committed with a full fsync.

    One connection, used from one thread at a time under a lock (calls come through
    ``asyncio.to_thread``): marks are recorded once per batch, not per message.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS marks (queue_uri TEXT, app_id TEXT, version INTEGER,"
                " digest BLOB, rows INTEGER, committed_at REAL, PRIMARY KEY (queue_uri, app_id))"
            )
        except sqlite3.Error as error:
            raise OSError(f"cannot open the commit mark file {path}: {error}") from error

    def load(self) -> dict[tuple[str, str], Mark]:
        """Every stored mark."""
        with self._lock:
            rows = self._db.execute(
                "SELECT queue_uri, app_id, version, digest, rows, committed_at FROM marks"
            ).fetchall()
        return {(uri, app): Mark(v, bytes(d), n, at) for uri, app, v, d, n, at in rows}

    def save(self, queue_uri: str, app_id: str, mark: Mark) -> None:
        """Store ``mark`` durably (replacing the application's previous one)."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO marks VALUES (?, ?, ?, ?, ?, ?)",
                (queue_uri, app_id, mark.version, mark.digest, mark.rows, mark.committed_at),
            )

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()


def mark_file_for(store_spec: str) -> MarkFile | None:
    """The mark file that goes with a ``--store`` value (None for ``memory``)."""
    parsed = parse_store_spec(store_spec)
    if parsed.kind == "sqlite":
        return MarkFile(parsed.location + "-marks")
    return None


class MarkBook:
    """The broker's commit marks, in memory, written through to a ``MarkFile`` if any."""

    def __init__(self, file: MarkFile | None = None, clock: Callable[[], float] = time.time):
        self._file = file
        self._clock = clock
        self._marks: dict[tuple[str, str], Mark] = file.load() if file is not None else {}
        self._lock = asyncio.Lock()
        self.recorded = 0
        """Marks recorded (new versions), for logs and metrics."""

    def __len__(self) -> int:
        return len(self._marks)

    async def handle(
        self, request: pb.CommitMarkRequest, context: Any = None
    ) -> pb.CommitMarkReply:
        """Serve one ``CommitMark`` call."""
        problem = invalid_mark_request(request)
        if problem is not None:
            return pb.CommitMarkReply(status=pb.STATUS_INVALID_ARGUMENT, message=problem)
        key = (request.queue_uri, request.app_id)
        if not request.record:
            return mark_reply(self._marks.get(key), request.app_id)
        # One recorder at a time, so that two replays of one version cannot both win.
        async with self._lock:
            decided = self._decided(request)
            if decided is not None:
                return decided
            mark = Mark(request.version, bytes(request.digest), request.rows, self._clock())
            if self._file is not None:
                try:
                    await asyncio.to_thread(self._file.save, *key, mark)
                except (sqlite3.Error, OSError) as error:
                    log.error("cannot store a commit mark in %s: %s", self._file.path, error)
                    return pb.CommitMarkReply(
                        status=pb.STATUS_STORE_ERROR, message=f"cannot store the mark: {error}"
                    )
            self._marks[key] = mark
            self.recorded += 1
            log.info(
                "commit mark: %s on %s at version %d (%d rows)",
                request.app_id[:QUOTE_LIMIT],
                request.queue_uri,
                mark.version,
                mark.rows,
            )
            return mark_reply(mark, request.app_id)

    def _decided(self, request: pb.CommitMarkRequest) -> pb.CommitMarkReply | None:
        """The reply to a record request that the stored mark decides (a replay, a
        conflict, an older version: nothing to store); None if it is to be stored."""
        stored = self._marks.get((request.queue_uri, request.app_id))
        if stored is None or request.version > stored.version:
            return None
        reply = mark_reply(stored, request.app_id)
        if request.version == stored.version and request.digest != stored.digest:
            reply.status = pb.STATUS_CONFLICT
            reply.message = (
                f"version {request.version} of {request.app_id[:QUOTE_LIMIT]!r} on "
                f"{request.queue_uri[:QUOTE_LIMIT]} was committed with other content "
                f"({stored.rows} rows; this one has {request.rows})"
            )
        return reply

    def restore(self, request: pb.CommitMarkRequest) -> pb.CommitMarkReply:
        """Record a mark at start, before the broker serves (so without the lock), by
        the rules of ``handle``: a commit the store recorded but whose mark a crash cut
        off. Raises ``OSError`` if the mark file cannot be written."""
        decided = self._decided(request)
        if decided is not None:
            return decided
        mark = Mark(request.version, bytes(request.digest), request.rows, self._clock())
        if self._file is not None:
            try:
                self._file.save(request.queue_uri, request.app_id, mark)
            except sqlite3.Error as error:
                raise OSError(f"cannot store a commit mark in {self._file.path}: {error}") from None
        self._marks[(request.queue_uri, request.app_id)] = mark
        self.recorded += 1
        return mark_reply(mark, request.app_id)

    def close(self) -> None:
        """Close the mark file, if any."""
        if self._file is not None:
            self._file.close()


def invalid_mark_request(request: pb.CommitMarkRequest) -> str | None:
    """What is wrong with a ``CommitMark`` request, or None."""
    try:
        parse_queue_uri(request.queue_uri)
    except ValueError as error:
        return str(error)[:200]
    if not request.app_id:
        return "app_id must not be empty"
    if len(request.app_id.encode()) > MAX_APP_ID_BYTES:
        return f"app_id longer than {MAX_APP_ID_BYTES} bytes: {request.app_id[:QUOTE_LIMIT]!r}..."
    if len(request.digest) > MAX_DIGEST_BYTES:
        return f"digest of {len(request.digest)} bytes, more than {MAX_DIGEST_BYTES}"
    return None


def mark_reply(mark: Mark | None, app_id: str) -> pb.CommitMarkReply:
    """The OK reply that shows ``mark`` (None: no mark)."""
    if mark is None:
        return pb.CommitMarkReply(status=pb.STATUS_OK, found=False)
    return pb.CommitMarkReply(
        status=pb.STATUS_OK,
        found=True,
        mark=pb.CommitMark(
            app_id=app_id,
            version=mark.version,
            digest=mark.digest,
            rows=mark.rows,
            committed_at=mark.committed_at,
        ),
    )

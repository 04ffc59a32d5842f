"""How a ``StoreBatch`` becomes rows of the SQLite store, and how the history is pruned.

Runs on the store's writer thread, inside the transaction the writer opened (see
``sqlite_store``); the layout is in ``sqlite_schema``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from holdfast.broker.sqlite_schema import (
    CLEAR_POLICY,
    COMPLETE_SINCE,
    DELETE_QUEUE,
    DELIVERY_ROWS,
    FORGET_COMMIT,
    HISTORY_ROWS,
    MESSAGE_ROWS,
    PRUNED_AT,
    RECORD_COMMIT,
    REMOVED_ROWS,
    SET_POLICY,
    RowsStatement,
    encode_attempts,
    encode_properties,
)
from holdfast.broker.store import StoreBatch
from holdfast.proto.policy import NO_POLICY


class Rows:
    """Writes batches as rows: knows the queue ids of the file and the next ``seq``."""

    def __init__(self, queue_ids: dict[str, int], next_seq: int) -> None:
        self.queue_ids = queue_ids
        """Queue URI -> its id in the ``queues`` table."""
        self.next_seq = next_seq
        """The ``seq`` of the next message (max + 1 at open)."""
        self.deleted: list[tuple[str, int]] = []
        """Queues deleted by the transaction in progress (restored if it fails)."""

    def apply(
        self, connection: sqlite3.Connection, batch: StoreBatch, new_queues: list[str]
    ) -> None:
        """Insert, update and delete the rows of ``batch``; URIs of queues created go
        to ``new_queues`` (to ``forget`` if the transaction fails)."""
        ids = self.queue_ids
        if batch.messages:
            seq = self.next_seq
            # Flat columns, row after row: each statement inserts many rows (``run_rows``).
            rows: list[Any] = []
            history: list[Any] = []
            add_row = rows.extend
            add_history = history.extend
            last_uri = ""
            queue_id = 0
            held = 0  # payload bytes in ``rows``, bounded by ``CHUNK_BYTES``
            for message in batch.messages:
                if message.queue_uri != last_uri:
                    last_uri = message.queue_uri
                    queue_id = ids.get(last_uri) or self._add_queue(
                        connection, last_uri, new_queues
                    )
                properties = message.properties
                guid = message.guid
                accepted_at = message.accepted_at
                digest = message.digest
                payload = message.payload
                if held + len(payload) > CHUNK_BYTES:
                    run_rows(connection, MESSAGE_ROWS, rows)
                    rows.clear()
                    held = 0
                held += len(payload)
                add_row(
                    (
                        seq,
                        queue_id,
                        guid,
                        accepted_at,
                        message.delivery_count,
                        digest,
                        encode_properties(properties) if properties else None,
                        payload,
                    )
                )
                add_history((queue_id, guid, accepted_at, digest))
                seq += 1
            run_rows(connection, MESSAGE_ROWS, rows)
            run_rows(connection, HISTORY_ROWS, history)
            # Gaps left by a rolled-back transaction are harmless: only order matters.
            self.next_seq = seq
        if batch.delivered:
            # A queue the store never saw holds no message to update (nor to remove).
            # One count a message: the last, as one row by one would leave it (counts
            # only rise), since a join updating a row twice keeps either.
            counts: dict[tuple[int, bytes], int] = {}
            for update in batch.delivered:
                if update.queue_uri in ids:
                    counts[ids[update.queue_uri], update.guid] = update.delivery_count
            delivered: list[Any] = []
            for (queue_id, guid), count in counts.items():
                delivered += (count, queue_id, guid)
            run_rows(connection, DELIVERY_ROWS, delivered)
        if batch.removed:
            removed: list[Any] = []
            for key in batch.removed:
                if key.queue_uri in ids:
                    removed += (ids[key.queue_uri], key.guid)
            run_rows(connection, REMOVED_ROWS, removed)
        for uri, policy in batch.policies:
            if policy == NO_POLICY:
                if uri in ids:
                    connection.execute(CLEAR_POLICY, (ids[uri],))
            else:
                queue_id = ids.get(uri) or self._add_queue(connection, uri, new_queues)
                connection.execute(SET_POLICY, (queue_id, policy.to_json()))
        for uri in batch.deleted:
            queue_id = ids.pop(uri, 0)
            if queue_id:
                self.deleted.append((uri, queue_id))
                for statement in DELETE_QUEUE:
                    connection.execute(statement, (queue_id,))
        if batch.forgotten:
            connection.executemany(
                FORGET_COMMIT, [(c.queue_uri, c.app_id, c.version) for c in batch.forgotten]
            )
        commit = batch.commit
        if commit is not None:
            connection.execute(
                RECORD_COMMIT,
                (
                    commit.queue_uri,
                    commit.app_id,
                    commit.version,
                    commit.digest,
                    commit.rows,
                    encode_attempts(commit.attempts),
                ),
            )

    def forget(self, new_queues: list[str]) -> None:
        """Queue ids handed out in a failed transaction do not exist in the file, and
        the queues it deleted still do."""
        for uri in new_queues:
            self.queue_ids.pop(uri, None)
        for uri, queue_id in self.deleted:
            self.queue_ids[uri] = queue_id
        self.deleted.clear()

    def committed(self) -> None:
        """The transaction in progress committed."""
        self.deleted.clear()

    def _add_queue(self, connection: sqlite3.Connection, uri: str, new_queues: list[str]) -> int:
        cursor = connection.execute("INSERT INTO queues (uri) VALUES (?)", (uri,))
        queue_id = cursor.lastrowid
        assert queue_id is not None
        self.queue_ids[uri] = queue_id
        new_queues.append(uri)
        return queue_id


CHUNK_ROWS = 256
"""Rows one statement takes at most (2,048 values for a message row of 8): a batch of
1,000 PUTs is 3 statements of 256 and, for the rest, one of each power of two it
needs (232 = 128 + 64 + 32 + 8), so that few statement texts are ever prepared."""
CHUNK_BYTES = 1 << 20
"""Payload bytes one statement of message rows binds at most (a larger payload goes
alone). SQLite copies every blob it is bound, and keeps the copies until the statement
is done: 256 payloads of 4 MiB in one statement would hold 1 GiB more for its length,
where a statement a row held one payload's copy."""


def run_rows(connection: sqlite3.Connection, statement: RowsStatement, values: list[Any]) -> None:
    """Run ``statement`` over the rows whose values follow one another in ``values``
    (``statement.width`` each), many rows a statement.

    Not ``executemany``: it releases the interpreter lock around each row's step and
    takes it back after, so the writer thread waits for the broker's event loop once
    a row while the loop is busy (measured: ``bench/PROFILE.md``, "sqlite: many rows a
    statement"); one statement of many rows waits once."""
    width = statement.width
    count = len(values) // width
    at = 0
    while at < count:
        rows = CHUNK_ROWS
        while rows > count - at:
            rows //= 2
        connection.execute(statement.sql(rows), values[at * width : (at + rows) * width])
        at += rows


def prune_history(
    connection: sqlite3.Connection, cutoff: float, chunk: int, now: float | None = None
) -> tuple[int, bool]:
    """Delete the oldest history rows accepted at or before ``cutoff``, at most
    ``chunk``. Returns how many, and whether a whole chunk went (more may be waiting).
    Records what the history still covers (``COMPLETE_SINCE``) and, with ``now``, when
    (``PRUNED_AT``: the broker's clock resumes no earlier at the next start)."""
    cursor = connection.execute(
        "SELECT rowid, accepted_at FROM history ORDER BY rowid LIMIT ?", (chunk,)
    )
    # Rowid order is acceptance order, so the expired rows are a prefix and the scan
    # stops at the first live one (the broker clock never steps back).
    last = None
    last_accepted = 0.0
    count = 0
    try:
        for rowid, accepted_at in cursor:
            if accepted_at > cutoff:
                break
            last, last_accepted = rowid, accepted_at
            count += 1
    finally:
        cursor.close()
    if last is not None:
        connection.execute("DELETE FROM history WHERE rowid <= ?", (last,))
        # What the history still vouches for: a broker restarted with a longer window
        # must not take this file for a longer history than it holds.
        entries = [(COMPLETE_SINCE, last_accepted)]
        if now is not None:
            entries.append((PRUNED_AT, now))
        connection.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", entries)
    return count, count == chunk

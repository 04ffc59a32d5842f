"""How a ``StoreBatch`` becomes rows of the SQLite store, and how the history is pruned.

Runs on the store's writer thread, inside the transaction the writer opened (see
``sqlite_store``); the layout is in ``sqlite_schema``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from holdfast.broker.sqlite_schema import (
    CLEAR_POLICY,
    DELETE_MESSAGE,
    DELETE_QUEUE,
    FORGET_COMMIT,
    INSERT_HISTORY,
    INSERT_MESSAGE,
    RECORD_COMMIT,
    SET_POLICY,
    UPDATE_DELIVERY,
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
            rows: list[tuple[Any, ...]] = []
            history: list[tuple[int, bytes, float, int]] = []
            last_uri = ""
            queue_id = 0
            for message in batch.messages:
                if message.queue_uri != last_uri:
                    last_uri = message.queue_uri
                    queue_id = ids.get(last_uri) or self._add_queue(
                        connection, last_uri, new_queues
                    )
                properties = message.properties
                rows.append(
                    (
                        seq,
                        queue_id,
                        message.guid,
                        message.accepted_at,
                        message.delivery_count,
                        message.digest,
                        encode_properties(properties) if properties else None,
                        message.payload,
                    )
                )
                history.append((queue_id, message.guid, message.accepted_at, message.digest))
                seq += 1
            connection.executemany(INSERT_MESSAGE, rows)
            connection.executemany(INSERT_HISTORY, history)
            # Gaps left by a rolled-back transaction are harmless: only order matters.
            self.next_seq = seq
        if batch.delivered:
            # A queue the store never saw holds no message to update (nor to remove).
            connection.executemany(
                UPDATE_DELIVERY,
                [
                    (update.delivery_count, ids[update.queue_uri], update.guid)
                    for update in batch.delivered
                    if update.queue_uri in ids
                ],
            )
        if batch.removed:
            connection.executemany(
                DELETE_MESSAGE,
                [(ids[key.queue_uri], key.guid) for key in batch.removed if key.queue_uri in ids],
            )
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


def prune_history(connection: sqlite3.Connection, cutoff: float, chunk: int) -> tuple[int, bool]:
    """Delete the oldest history rows accepted at or before ``cutoff``, at most
    ``chunk``. Returns how many, and whether a whole chunk went (more may be waiting)."""
    cursor = connection.execute(
        "SELECT rowid, accepted_at FROM history ORDER BY rowid LIMIT ?", (chunk,)
    )
    # Rowid order is acceptance order, so the expired rows are a prefix and the scan
    # stops at the first live one (the broker clock never steps back).
    last = None
    count = 0
    try:
        for rowid, accepted_at in cursor:
            if accepted_at > cutoff:
                break
            last = rowid
            count += 1
    finally:
        cursor.close()
    if last is not None:
        connection.execute("DELETE FROM history WHERE rowid <= ?", (last,))
    return count, count == chunk

"""The layout of the SQLite store's file: creating, checking and reading it back.

Schema (version 4, in ``meta``)
-------------------------------

::

    meta(key TEXT PRIMARY KEY, value)                  -- 'schema_version', 'application',
                                                       -- 'history_complete_since',
                                                       -- 'history_pruned_at'
    queues(id INTEGER PRIMARY KEY, uri TEXT UNIQUE)    -- URI stored once, rows carry the id
    messages(seq INTEGER PRIMARY KEY,                  -- store-wide acceptance order
             queue_id INTEGER, guid BLOB, accepted_at REAL, delivery_count INTEGER,
             digest INTEGER,                           -- content digest (CONFLICT check)
             properties TEXT,                          -- compact JSON; NULL when none
             payload BLOB)                             -- last: large values overflow last
    UNIQUE INDEX messages_by_guid ON messages(queue_id, guid)
    history(queue_id INTEGER, guid BLOB, accepted_at REAL, digest INTEGER)
                                                       -- append-only, rowid order
    policies(queue_id INTEGER PRIMARY KEY, policy TEXT)  -- ``QueuePolicy.to_json``
    commits(queue_uri TEXT, app_id TEXT,               -- ``store.CommitRecord``: one per
            version INTEGER, digest BLOB, rows INTEGER, --   writer application and queue
            attempts TEXT,                             -- JSON [[partition, attempt, rows]]
            PRIMARY KEY (queue_uri, app_id))

Version 4 added ``commits``, version 3 ``policies``; a version 2 or 3 file is
upgraded in place at open (the missing tables are created, nothing else changes). A
transactional write's commit writes its record in the transaction of the messages it
publishes, and the broker deletes it once the commit mark (another file) is durable;
``commits`` names the writer's queue by URI, not by queue id: a redirect sends the
rows to another queue, and the writer's may have no row in ``queues`` at all.

Version 2 added the ``digest`` columns, and ``accepted_at`` became a time on
the broker's clock (``dedup.BrokerClock``, resumed from the latest persisted time at
start) instead of the wall clock. A version 1 file is refused with a one-line error:
its history has no digests and its times are on another clock, so it cannot vouch
for replays; drain it with a version 1 broker first.

Why this shape: ``seq`` is the rowid, assigned by the writer (max + 1 at open), so a
new message is appended at the end of the table's B-tree and recovery reads the
table in order; it is store-wide, hence increasing within every queue. Confirmations
and delivery counts find a message by ``(queue_id, guid)``. The history is never
searched by GUID (the broker keeps it in memory); it is only read whole at start and
pruned from its old end, so it needs no index at all: its rowid order is acceptance
order, and pruning deletes the expired prefix in small chunks piggybacked on group
commits (or on their own transaction when the broker is idle). A PUT therefore costs
three B-tree inserts.

The broker never accepts a GUID whose message is still in the queue, so the
``ON CONFLICT DO NOTHING`` of the message insert is only a guard.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from holdfast.broker.store import (
    NO_PROPERTIES,
    CommitRecord,
    HistoryEntry,
    RecoveredState,
    StoredMessage,
    StoreError,
)
from holdfast.proto.policy import QueuePolicy

SCHEMA_VERSION = 3
"""The layout this module reads and writes (``meta.schema_version``)."""

APPLICATION = "holdfast-broker"
"""``meta.application``: tells a Holdfast store from any other SQLite file."""
COMPLETE_SINCE = "history_complete_since"
"""``meta`` key: the acceptance time (broker clock) of the newest history row pruned,
so every GUID accepted later is still in the history. Absent: nothing was pruned yet
(or the store was last written by a version that did not record it)."""
PRUNED_AT = "history_pruned_at"
"""``meta`` key: the broker-clock time of that prune. The clock resumes no earlier than
it, as it resumes no earlier than the newest acceptance time stored."""

BUSY_TIMEOUT = 1.0
"""Seconds to wait for a lock at open (a broker on the same file that is exiting)."""

_POLICIES = "CREATE TABLE policies (queue_id INTEGER PRIMARY KEY, policy TEXT NOT NULL)"
_COMMITS = (
    "CREATE TABLE commits (queue_uri TEXT NOT NULL, app_id TEXT NOT NULL,"
    " version INTEGER NOT NULL, digest BLOB NOT NULL, rows INTEGER NOT NULL,"
    " attempts TEXT NOT NULL, PRIMARY KEY (queue_uri, app_id)) WITHOUT ROWID"
)
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE queues (id INTEGER PRIMARY KEY, uri TEXT NOT NULL UNIQUE)",
    "CREATE TABLE messages ("
    " seq INTEGER PRIMARY KEY,"
    " queue_id INTEGER NOT NULL,"
    " guid BLOB NOT NULL,"
    " accepted_at REAL NOT NULL,"
    " delivery_count INTEGER NOT NULL,"
    " digest INTEGER NOT NULL,"
    " properties TEXT,"
    " payload BLOB NOT NULL)",
    "CREATE UNIQUE INDEX messages_by_guid ON messages (queue_id, guid)",
    "CREATE TABLE history ("
    " queue_id INTEGER NOT NULL, guid BLOB NOT NULL, accepted_at REAL NOT NULL,"
    " digest INTEGER NOT NULL)",
    _POLICIES,
    _COMMITS,
)
_TABLES = frozenset({"meta", "queues", "messages", "history", "policies", "commits"})
UPGRADES = {2: {"policies": _POLICIES, "commits": _COMMITS}, 3: {"commits": _COMMITS}}
"""Older schema versions upgraded in place: the tables each lacks."""


@dataclass(frozen=True)
class RowsStatement:
    """A statement over any number of rows of ``width`` values, given to it as one
    ``VALUES`` list between ``head`` and ``tail`` (see ``sqlite_rows.run_rows``)."""

    head: str
    width: int
    tail: str = ""

    def sql(self, rows: int) -> str:
        """The statement's text for ``rows`` rows (made once per count)."""
        return _texts(self, rows)


@functools.cache
def _texts(statement: RowsStatement, rows: int) -> str:
    row = "(" + ", ".join("?" * statement.width) + ")"
    return f"{statement.head}VALUES {', '.join([row] * rows)}{statement.tail}"


MESSAGE_ROWS = RowsStatement(
    "INSERT INTO messages"
    " (seq, queue_id, guid, accepted_at, delivery_count, digest, properties, payload) ",
    8,
    " ON CONFLICT (queue_id, guid) DO NOTHING",
)
HISTORY_ROWS = RowsStatement("INSERT INTO history (queue_id, guid, accepted_at, digest) ", 4)
DELIVERY_ROWS = RowsStatement(
    "UPDATE messages SET delivery_count = v.column1 FROM (",
    3,
    ") AS v WHERE messages.queue_id = v.column2 AND messages.guid = v.column3",
)
REMOVED_ROWS = RowsStatement(
    # Joined through the index: a row value IN a VALUES list would scan the table.
    "DELETE FROM messages WHERE seq IN (SELECT m.seq FROM (",
    2,
    ") AS v JOIN messages AS m ON m.queue_id = v.column1 AND m.guid = v.column2)",
)
SET_POLICY = (
    "INSERT INTO policies (queue_id, policy) VALUES (?, ?)"
    " ON CONFLICT (queue_id) DO UPDATE SET policy = excluded.policy"
)
CLEAR_POLICY = "DELETE FROM policies WHERE queue_id = ?"
RECORD_COMMIT = "INSERT OR REPLACE INTO commits VALUES (?, ?, ?, ?, ?, ?)"
FORGET_COMMIT = "DELETE FROM commits WHERE queue_uri = ? AND app_id = ? AND version = ?"
DELETE_QUEUE = (
    "DELETE FROM messages WHERE queue_id = ?1",
    "DELETE FROM history WHERE queue_id = ?1",
    "DELETE FROM policies WHERE queue_id = ?1",
    "DELETE FROM queues WHERE id = ?1",
)


MIN_SQLITE = (3, 33, 0)
"""The oldest SQLite library the store runs on: ``UPDATE ... FROM`` (``DELIVERY_ROWS``)
came in 3.33.0 (2020), and with it room for the 2,048 values of a statement of rows
(``sqlite_rows.CHUNK_ROWS``)."""


def connect(path: str, sync: str) -> tuple[sqlite3.Connection, dict[str, int], int]:
    """Open and check the store at ``path``: (connection, queue ids by URI, next seq).
    Raises ``StoreError`` naming the path and the problem."""
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            f"cannot open sqlite store {path}: Python's sqlite3 module runs SQLite "
            f"{sqlite3.sqlite_version}; the store needs {'.'.join(map(str, MIN_SQLITE))} or later"
        )
    # SQLite says only "unable to open database file" for these; say what is wrong.
    if os.path.isdir(path):
        raise StoreError(f"cannot open sqlite store {path}: it is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise StoreError(f"cannot open sqlite store {path}: directory {directory} does not exist")
    try:
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
    except sqlite3.Error as error:
        raise StoreError(f"cannot open sqlite store {path}: {describe(error)}") from None
    try:
        return (connection, *_prepare(connection, path, sync))
    except StoreError:
        connection.close()
        raise
    except sqlite3.Error as error:
        connection.close()
        raise StoreError(f"cannot open sqlite store {path}: {describe(error)}") from None


def _prepare(connection: sqlite3.Connection, path: str, sync: str) -> tuple[dict[str, int], int]:
    # Set before WAL is entered: the lock is then held for the connection's life and
    # the WAL index lives in this process's memory, not in a shared -shm file.
    connection.execute("PRAGMA locking_mode = EXCLUSIVE")
    (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise StoreError(
            f"cannot open sqlite store {path}: "
            f"the file system does not support WAL mode (journal mode is {mode})"
        )
    connection.execute(f"PRAGMA synchronous = {sync.upper()}")
    # Let the WAL shrink back after checkpoints instead of keeping its peak size.
    connection.execute("PRAGMA journal_size_limit = 67108864")
    connection.execute("PRAGMA cache_size = -65536")
    # Takes the exclusive lock now: a second broker on this file fails here.
    connection.execute("BEGIN IMMEDIATE")
    try:
        _check_schema(connection, path)
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    queue_ids = {uri: qid for qid, uri in connection.execute("SELECT id, uri FROM queues")}
    (last_seq,) = connection.execute("SELECT max(seq) FROM messages").fetchone()
    return queue_ids, (last_seq or 0) + 1


def _check_schema(connection: sqlite3.Connection, path: str) -> None:
    tables = {
        name
        for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if not tables:
        for statement in _SCHEMA:
            connection.execute(statement)
        connection.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("schema_version", SCHEMA_VERSION), ("application", APPLICATION)],
        )
        return
    meta: dict[str, Any] = {}
    if "meta" in tables:
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("application") != APPLICATION:
        raise StoreError(
            f"cannot open sqlite store {path}: it is an SQLite database but not a "
            f"Holdfast store (tables: {', '.join(sorted(tables))})"
        )
    version = meta.get("schema_version")
    if version in UPGRADES:
        for table, statement in UPGRADES[version].items():
            if table not in tables:
                connection.execute(statement)
                tables.add(table)
        connection.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,)
        )
        version = SCHEMA_VERSION
    if version != SCHEMA_VERSION:
        raise StoreError(
            f"cannot open sqlite store {path}: its schema version is {version!r}, "
            f"this broker reads version {SCHEMA_VERSION}"
        )
    missing = _TABLES - tables
    if missing:
        raise StoreError(
            f"cannot open sqlite store {path}: tables {', '.join(sorted(missing))} are missing"
        )


def read_state(connection: sqlite3.Connection, path: str, retention: float) -> RecoveredState:
    """Every queue's messages (acceptance order, with delivery counts and digests), the
    history within ``retention`` seconds of the latest persisted time, and that time."""
    try:
        names = {qid: uri for qid, uri in connection.execute("SELECT id, uri FROM queues")}
        queues: dict[str, list[StoredMessage]] = {}
        latest = 0.0
        cursor = connection.execute(
            "SELECT seq, queue_id, guid, payload, properties, accepted_at, delivery_count, digest"
            " FROM messages ORDER BY seq"
        )
        for seq, queue_id, guid, payload, properties, accepted_at, count, digest in cursor:
            uri = names.get(queue_id)
            if uri is None:
                raise StoreError(
                    f"cannot read sqlite store {path}: "
                    f"message {seq} names queue {queue_id}, which does not exist"
                )
            ready = queues.get(uri)
            if ready is None:
                ready = queues[uri] = []
            ready.append(
                StoredMessage(
                    uri,
                    guid,
                    payload,
                    decode_properties(properties, seq) if properties is not None else NO_PROPERTIES,
                    accepted_at,
                    count,
                    digest,
                )
            )
            latest = max(latest, accepted_at)
        (last_history,) = connection.execute("SELECT max(accepted_at) FROM history").fetchone()
        latest = max(latest, last_history or 0.0)
        meta = dict(
            connection.execute(
                "SELECT key, value FROM meta WHERE key IN (?, ?)", (COMPLETE_SINCE, PRUNED_AT)
            )
        )
        complete_since = float(meta[COMPLETE_SINCE]) if COMPLETE_SINCE in meta else None
        latest = max(latest, float(meta.get(PRUNED_AT, 0.0)))
        # The broker's clock resumes at ``latest``: what the window still covers is measured
        # from there, so downtime (and any wall-clock step during it) ages nothing.
        history = [
            HistoryEntry(names[queue_id], guid, accepted_at, digest)
            for queue_id, guid, accepted_at, digest in connection.execute(
                "SELECT queue_id, guid, accepted_at, digest FROM history"
                " WHERE accepted_at > ? ORDER BY rowid",
                (latest - retention,),
            )
            if queue_id in names
        ]
        policies = {
            names[queue_id]: QueuePolicy.from_json(text)
            for queue_id, text in connection.execute("SELECT queue_id, policy FROM policies")
            if queue_id in names
        }
        commits = tuple(
            CommitRecord(uri, app, version, bytes(digest), rows, decode_attempts(attempts))
            for uri, app, version, digest, rows, attempts in connection.execute(
                "SELECT queue_uri, app_id, version, digest, rows, attempts FROM commits"
            )
        )
    except sqlite3.Error as error:
        raise StoreError(f"cannot read sqlite store {path}: {describe(error)}") from None
    except ValueError as error:
        raise StoreError(f"cannot read sqlite store {path}: {error}") from None
    return RecoveredState(
        queues=queues,
        history=history,
        resume_at=latest,
        policies=policies,
        commits=commits,
        history_complete_since=complete_since,
    )


def encode_attempts(attempts: tuple[tuple[int, int, int], ...]) -> str:
    """A commit record's attempts as compact JSON."""
    return json.dumps(attempts, separators=(",", ":"))


def decode_attempts(text: str) -> tuple[tuple[int, int, int], ...]:
    """A commit record's attempts; ``ValueError`` if they do not read back."""
    try:
        return tuple((int(p), int(a), int(n)) for p, a, n in json.loads(text))
    except (TypeError, ValueError):
        raise ValueError(f"a commit record has unreadable attempts: {text[:100]!r}") from None


def encode_properties(properties: Mapping[str, str]) -> str:
    """Properties as compact JSON."""
    if type(properties) is not dict:
        properties = dict(properties)
    return json.dumps(properties, separators=(",", ":"), ensure_ascii=False)


def decode_properties(text: str, seq: int) -> Mapping[str, str]:
    """The properties of message ``seq``; ``ValueError`` if they do not read back."""
    try:
        properties = json.loads(text)
    except ValueError:
        raise ValueError(f"message {seq} has unreadable properties") from None
    if not isinstance(properties, dict):
        raise ValueError(f"message {seq} has unreadable properties")
    return properties


def describe(error: BaseException) -> str:
    """One line saying what went wrong, in words a user can act on."""
    text = str(error) or type(error).__name__
    if text.startswith("database is locked"):
        return "it is in use by another process (database is locked)"
    if text.startswith("unable to open database file"):
        return "unable to open the file (check its permissions and its directory's)"
    if text.startswith("attempt to write a readonly database"):
        return "the file or its directory is read-only"
    return text.splitlines()[0] if text else text

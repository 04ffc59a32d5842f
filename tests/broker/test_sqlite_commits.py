"""The SQLite store's commit records (``store.CommitRecord``): written in the transaction
of a batch, with or without messages, one per writer application and queue, read back
by a new store on the same file, and deleted when forgotten; a version 3 file gains the
table in place."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

from holdfast.broker.sqlite_store import SCHEMA_VERSION, SqliteStore
from holdfast.broker.store import CommitRecord, StoreBatch, StoredMessage

APP = "app-1"


def record(version: int, app: str = APP) -> CommitRecord:
    return CommitRecord("hf://t/q", app, version, b"d%d" % version, 3, ((0, 1, 3),))


def test_the_sqlite_store_keeps_a_commit_record_per_application_until_forgotten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "b.db"
    message = StoredMessage("hf://t/moved", uuid.uuid4().bytes, b"p", {}, 1.0)

    async def write(store: SqliteStore, *batches: StoreBatch) -> None:
        for batch in batches:
            await _write(store, batch)

    store = SqliteStore(path)
    store.recover()
    asyncio.run(
        write(
            store,
            StoreBatch(messages=[message], commit=record(1)),
            StoreBatch(commit=record(2)),  # no new message: every row was stored already
            StoreBatch(commit=record(7, "app-2")),
            StoreBatch(forgotten=[record(6, "app-2")]),  # another version: stays
        )
    )
    store.close()
    store = SqliteStore(path)
    state = store.recover()
    assert sorted(state.commits, key=lambda r: r.app_id) == [record(2), record(7, "app-2")]
    assert [m.guid for m in state.queues["hf://t/moved"]] == [message.guid]
    asyncio.run(write(store, StoreBatch(forgotten=[record(2), record(7, "app-2")])))
    store.close()
    store = SqliteStore(path)
    assert store.recover().commits == ()
    store.close()


def test_a_version_3_store_is_upgraded_in_place_with_a_commits_table(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    SqliteStore(path).close()
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("DROP TABLE commits")
        raw.execute("UPDATE meta SET value = 3 WHERE key = 'schema_version'")
    raw.close()
    store = SqliteStore(path)
    assert store.recover().commits == ()
    asyncio.run(_write(store, StoreBatch(commit=record(1))))
    store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        SCHEMA_VERSION,
    )
    raw.close()
    store = SqliteStore(path)
    assert store.recover().commits == (record(1),)
    store.close()


async def _write(store: SqliteStore, batch: StoreBatch) -> None:
    await store.write(batch)

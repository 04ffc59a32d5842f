"""SqliteStore on its own: a file under tmp_path, an asyncio loop, no broker.

What is written is read back by a *new* store on the same file, the way a restarted
broker reads it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from holdfast.broker.config import BrokerConfig
from holdfast.broker.dedup import BrokerClock, GuidHistory, content_digest
from holdfast.broker.sqlite_store import SCHEMA_VERSION, SqliteStore
from holdfast.broker.store import (
    DeliveryUpdate,
    MessageKey,
    RecoveredState,
    StoreBatch,
    StoredMessage,
    StoreError,
)
from holdfast.broker.stores import open_store, parse_store_spec

pytestmark = pytest.mark.timeout(60)

QUEUE_A = "hf://test/a"
QUEUE_B = "hf://test/b"


CLOCK = BrokerClock()
"""The broker clock the tests' messages are stamped with (stores get it too)."""


def guid() -> bytes:
    return uuid.uuid4().bytes


def message(
    uri: str = QUEUE_A,
    payload: bytes = b"payload",
    properties: dict[str, str] | None = None,
    accepted_at: float | None = None,
) -> StoredMessage:
    return StoredMessage(
        uri,
        guid(),
        payload,
        properties or {},
        CLOCK() if accepted_at is None else accepted_at,
    )


def write_all(store: SqliteStore, batches: Sequence[StoreBatch]) -> None:
    """Write ``batches`` concurrently on a fresh loop; raise the first failure."""

    async def run() -> None:
        await asyncio.wait_for(asyncio.gather(*(store.write(b) for b in batches)), 30)

    asyncio.run(run())


def recovered(path: Path, **options: Any) -> RecoveredState:
    """What a new store on ``path`` recovers (the store is closed again)."""
    store = SqliteStore(path, **options)
    try:
        return store.recover()
    finally:
        store.close()


def summary(state: RecoveredState) -> dict[str, list[tuple[bytes, bytes, dict[str, str], int]]]:
    return {
        uri: [(m.guid, m.payload, dict(m.properties), m.delivery_count) for m in messages]
        for uri, messages in state.queues.items()
    }


@contextmanager
def raw_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to ``path`` that commits and closes on exit."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            yield connection
    finally:
        connection.close()


@contextmanager
def writer_held(store: SqliteStore) -> Iterator[None]:
    """Keep the store's writer thread busy for the block, so that every write issued
    in it is taken as one group once the block ends (white box: uses ``_call``)."""
    started = threading.Event()
    release = threading.Event()

    def hold(_connection: sqlite3.Connection) -> None:
        started.set()
        release.wait(30)

    holder = threading.Thread(target=store._call, args=(hold,))
    holder.start()
    try:
        assert started.wait(10), "the writer never ran the holding job"
        yield
    finally:
        release.set()
        holder.join(10)


# -- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_messages_come_back_in_order_with_payload_properties_and_delivery_counts(
    path: Path, sync: str
) -> None:
    store = SqliteStore(path, sync=sync)
    assert store.recover() == RecoveredState(queues={}, history=[])
    first = [message(payload=f"a{i}".encode(), properties={"i": str(i)}) for i in range(5)]
    second = [message(QUEUE_B, payload=b"\x00\xff binary", properties={}), message()]
    empty_payload = message(QUEUE_B, payload=b"", properties={"k": "v", "ключ": "значение"})
    write_all(store, [StoreBatch(messages=first)])
    write_all(store, [StoreBatch(messages=second), StoreBatch(messages=[empty_payload])])
    write_all(
        store,
        [
            StoreBatch(
                delivered=[
                    DeliveryUpdate(QUEUE_A, first[1].guid, 1),
                    DeliveryUpdate(QUEUE_A, first[1].guid, 2),
                    DeliveryUpdate(QUEUE_B, empty_payload.guid, 7),
                ]
            )
        ],
    )
    store.close()

    state = recovered(path)
    expected_a = [*first, second[1]]
    assert summary(state) == {
        QUEUE_A: [
            (m.guid, m.payload, dict(m.properties), 2 if m is first[1] else 0) for m in expected_a
        ],
        QUEUE_B: [
            (second[0].guid, b"\x00\xff binary", {}, 0),
            (empty_payload.guid, b"", {"k": "v", "ключ": "значение"}, 7),
        ],
    }
    restored = state.queues[QUEUE_A][0]
    assert restored.accepted_at == first[0].accepted_at
    assert restored.queue_uri == QUEUE_A
    # Every accepted message is a history entry too.
    assert sorted((h.queue_uri, h.guid) for h in state.history) == sorted(
        (m.queue_uri, m.guid) for m in [*first, *second, empty_payload]
    )


def test_order_carries_on_across_restarts(path: Path) -> None:
    before = [message(payload=b"before") for _ in range(3)]
    store = SqliteStore(path)
    write_all(store, [StoreBatch(messages=before)])
    # The newest message goes: the next sequence number must still be above the rest.
    write_all(store, [StoreBatch(removed=[MessageKey(QUEUE_A, before[-1].guid)])])
    store.close()
    after = [message(payload=b"after") for _ in range(3)]
    store = SqliteStore(path)
    store.recover()
    write_all(store, [StoreBatch(messages=after)])
    store.close()
    assert [m.guid for m in recovered(path).queues[QUEUE_A]] == [
        *(m.guid for m in before[:2]),
        *(m.guid for m in after),
    ]


def test_confirmed_messages_are_removed_and_their_history_stays(
    path: Path, store: SqliteStore
) -> None:
    messages = [message(payload=f"m{i}".encode()) for i in range(4)]
    write_all(store, [StoreBatch(messages=messages)])
    write_all(
        store,
        [
            StoreBatch(
                removed=[
                    MessageKey(QUEUE_A, messages[1].guid),
                    MessageKey(QUEUE_A, messages[3].guid),
                    # Unknown GUIDs and queues are no error: nothing to remove.
                    MessageKey(QUEUE_A, guid()),
                    MessageKey("hf://test/never", guid()),
                ],
                delivered=[DeliveryUpdate("hf://test/never", guid(), 3)],
            )
        ],
    )
    store.close()
    state = recovered(path)
    assert [m.payload for m in state.queues[QUEUE_A]] == [b"m0", b"m2"]
    assert {h.guid for h in state.history} == {m.guid for m in messages}


def test_a_guid_stored_twice_in_a_queue_is_kept_once(path: Path, store: SqliteStore) -> None:
    original = message(payload=b"first")
    again = StoredMessage(QUEUE_A, original.guid, b"second", {}, CLOCK())
    elsewhere = StoredMessage(QUEUE_B, original.guid, b"other queue", {}, CLOCK())
    write_all(store, [StoreBatch(messages=[original])])
    write_all(store, [StoreBatch(messages=[again, elsewhere])])
    store.close()
    assert summary(recovered(path)) == {
        QUEUE_A: [(original.guid, b"first", {}, 0)],
        QUEUE_B: [(original.guid, b"other queue", {}, 0)],
    }


# -- the GUID history window ------------------------------------------------------------


def test_expired_history_is_not_recovered_and_is_pruned(path: Path) -> None:
    window = 60.0
    now = CLOCK()
    # Kept for the window plus the grace (30 s by default): these are past both.
    old = [message(accepted_at=now - 2 * window - 30 + i) for i in range(7)]
    live = [message(accepted_at=now - window / 2), message(accepted_at=now)]
    store = SqliteStore(path, dedup_window=window, prune_chunk=2, prune_interval=0.02, clock=CLOCK)
    write_all(store, [StoreBatch(messages=old), StoreBatch(messages=live)])
    # A confirmed message keeps its history entry for the window.
    write_all(store, [StoreBatch(removed=[MessageKey(QUEUE_A, live[0].guid)])])
    deadline = time.monotonic() + 10
    while store.pruned < len(old):
        assert time.monotonic() < deadline, f"only {store.pruned} history rows pruned"
        time.sleep(0.01)
    assert store.pruned == len(old)
    state = store.recover()
    store.close()

    assert {h.guid for h in state.history} == {m.guid for m in live}
    # Messages are not pruned, however old: only confirmation removes them.
    assert [m.guid for m in state.queues[QUEUE_A]] == [m.guid for m in [*old, live[1]]]
    with raw_connection(path) as raw:
        rows = raw.execute("SELECT guid FROM history").fetchall()
    assert {row[0] for row in rows} == {m.guid for m in live}


def test_history_older_than_the_window_is_not_recovered_even_unpruned(path: Path) -> None:
    now = CLOCK()
    # Written after a newer entry (times out of order): pruning, which only
    # deletes the expired prefix of the history, leaves it, but recovery must not return it.
    entries = [message(accepted_at=now - 10), message(accepted_at=now - 100)]
    store = SqliteStore(path, dedup_window=1000)
    write_all(store, [StoreBatch(messages=entries)])
    store.close()
    assert [h.guid for h in recovered(path, dedup_window=50).history] == [entries[0].guid]
    with raw_connection(path) as raw:
        assert raw.execute("SELECT count(*) FROM history").fetchone() == (2,)
    assert len(recovered(path, dedup_window=1000).history) == 2


# -- group commit and failures ----------------------------------------------------------


def test_concurrent_writes_share_commits(path: Path) -> None:
    store = SqliteStore(path, sync="full")
    messages = [message(payload=f"{i}".encode()) for i in range(1000)]
    write_all(store, [StoreBatch(messages=[m]) for m in messages])
    commits = store.commits
    assert store.batches == 1000
    store.close()
    print(f"1000 concurrent writes: {commits} commits")
    assert commits <= 100, f"{commits} commits for 1000 concurrent writes"
    assert [m.guid for m in recovered(path).queues[QUEUE_A]] == [m.guid for m in messages]


def test_a_failing_write_fails_its_future_and_only_its_own(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(path)
    new_queue = "hf://test/created-in-a-failed-group"
    bad = StoredMessage(new_queue, guid(), cast(bytes, object()), {}, CLOCK())
    good_before = message(new_queue, payload=b"before")
    good_after = message(new_queue, payload=b"after")

    async def run() -> list[BaseException | None]:
        with writer_held(store):
            # Taken as one group: the bad batch fails the group's transaction, and the
            # store then writes each batch on its own.
            futures: list[Awaitable[None]] = [
                store.write(StoreBatch(messages=[good_before])),
                store.write(StoreBatch(messages=[bad])),
                store.write(StoreBatch(messages=[good_after])),
            ]
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
        return [r if isinstance(r, BaseException) else None for r in results]

    outcomes = asyncio.run(run())
    assert outcomes[0] is None
    assert isinstance(outcomes[1], StoreError)
    assert str(path) in str(outcomes[1])
    assert outcomes[2] is None
    assert "a group of 3 batches failed" in caplog.text
    assert store.commits == 2

    async def alone() -> None:
        with pytest.raises(StoreError, match="write failed"):
            await asyncio.wait_for(store.write(StoreBatch(messages=[bad])), 30)
        # The store carries on.
        await asyncio.wait_for(store.write(StoreBatch(messages=[message(QUEUE_B)])), 30)

    asyncio.run(alone())
    store.close()
    state = recovered(path)
    assert [m.payload for m in state.queues[new_queue]] == [b"before", b"after"]
    assert len(state.queues[QUEUE_B]) == 1


def test_close_commits_what_was_taken_and_later_writes_fail(path: Path) -> None:
    store = SqliteStore(path)
    messages = [message() for _ in range(50)]

    async def run() -> None:
        futures = [store.write(StoreBatch(messages=[m])) for m in messages]
        store.close()  # the futures' callbacks run once the loop gets control back
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        with pytest.raises(StoreError, match="closed"):
            await store.write(StoreBatch(messages=[message()]))

    asyncio.run(run())
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.recover()
    assert len(recovered(path).queues[QUEUE_A]) == 50


def test_an_empty_batch_needs_no_commit(store: SqliteStore) -> None:
    async def run() -> None:
        await store.write(StoreBatch())

    asyncio.run(run())
    assert store.commits == 0


# -- files that cannot be used ----------------------------------------------------------


def test_a_file_of_random_bytes_is_refused(path: Path) -> None:
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match="file is not a database") as raised:
        SqliteStore(path)
    assert str(path) in str(raised.value)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory") as raised:
        SqliteStore(tmp_path)
    assert str(tmp_path) in str(raised.value)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "broker.db"
    with pytest.raises(StoreError, match="does not exist") as raised:
        SqliteStore(missing)
    assert str(missing) in str(raised.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_an_unwritable_location_is_refused() -> None:
    # /proc refuses new files even to root, unlike a chmod-ed directory.
    location = "/proc/holdfast-broker.db"
    with pytest.raises(StoreError, match="unable to open") as raised:
        SqliteStore(location)
    assert location in str(raised.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only files")
def test_a_read_only_file_is_refused(path: Path) -> None:
    SqliteStore(path).close()
    path.chmod(0o400)
    try:
        with pytest.raises(StoreError) as raised:
            SqliteStore(path)
        assert str(path) in str(raised.value)
    finally:
        path.chmod(0o600)


def test_another_sqlite_database_is_refused(path: Path) -> None:
    with raw_connection(path) as raw:
        raw.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreError, match="not a Holdfast store") as raised:
        SqliteStore(path)
    assert str(path) in str(raised.value)


def test_another_schema_version_is_refused(path: Path) -> None:
    SqliteStore(path).close()
    with raw_connection(path) as raw:
        raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match=f"schema version is {SCHEMA_VERSION + 1}") as raised:
        SqliteStore(path)
    assert str(path) in str(raised.value)


def test_a_version_1_file_is_refused_in_one_line(path: Path) -> None:
    SqliteStore(path).close()
    with raw_connection(path) as raw:
        raw.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version is 1, this broker reads version 3"):
        SqliteStore(path)


def test_digests_persist_with_messages_and_history(path: Path) -> None:
    first = message(payload=b"a", properties={"k": "v"})
    first.digest = content_digest(b"a", {"k": "v"})
    store = SqliteStore(path, clock=CLOCK)
    write_all(store, [StoreBatch(messages=[first])])
    write_all(store, [StoreBatch(removed=[MessageKey(QUEUE_A, first.guid)])])
    second = message(payload=b"b")
    second.digest = -5  # digests are signed 64-bit
    write_all(store, [StoreBatch(messages=[second])])
    store.close()
    state = recovered(path)
    assert [(h.guid, h.digest) for h in state.history] == [
        (first.guid, first.digest),
        (second.guid, -5),
    ]
    assert [m.digest for m in state.queues[QUEUE_A]] == [-5]


def test_downtime_and_wall_clock_steps_age_nothing_after_a_restart(path: Path) -> None:
    # First run: a broker clock on a fake monotonic clock; one GUID accepted at 100 s.
    ticks = [1000.0]
    first_run = BrokerClock(lambda: ticks[0])
    ticks[0] += 100
    entry = message(accepted_at=first_run())
    store = SqliteStore(path, dedup_window=60, dedup_grace=0, clock=first_run)
    write_all(store, [StoreBatch(messages=[entry])])
    store.close()
    # Second run, a "day later" by any wall clock, on a monotonic clock that restarted:
    # the clock resumes where the file stopped, so the entry has its whole window left.
    later = [5.0]
    second_run = BrokerClock(lambda: later[0])
    store = SqliteStore(path, dedup_window=60, dedup_grace=0, clock=second_run)
    try:
        state = store.recover()
        assert state.resume_at == entry.accepted_at
        assert [h.guid for h in state.history] == [entry.guid]
        assert second_run() == entry.accepted_at
        history = GuidHistory(window=60, grace=0, clock=second_run)
        history.record(entry.guid, 0, state.history[0].accepted_at)
        later[0] += 59
        history.expire()
        assert entry.guid in history  # 59 s of this run: still inside the window
    finally:
        store.close()


def test_an_empty_file_becomes_a_store(path: Path) -> None:
    path.write_bytes(b"")
    store = SqliteStore(path)
    try:
        assert store.recover() == RecoveredState(queues={}, history=[])
    finally:
        store.close()


def test_a_store_in_use_by_another_broker_is_refused(path: Path, store: SqliteStore) -> None:
    with pytest.raises(StoreError, match="in use by another process") as raised:
        SqliteStore(path)
    assert str(path) in str(raised.value)


def test_damaged_pages_fail_at_open_or_recovery_with_store_error(path: Path) -> None:
    store = SqliteStore(path)
    write_all(store, [StoreBatch(messages=[message(payload=os.urandom(300)) for _ in range(2000)])])
    store.close()
    page = 4096
    assert path.stat().st_size > 20 * page
    with path.open("r+b") as file:
        file.seek(5 * page)
        file.write(os.urandom(3 * page))
    with pytest.raises(StoreError, match="malformed") as raised:
        recovered(path)
    assert str(path) in str(raised.value)


def test_unreadable_properties_fail_recovery(path: Path) -> None:
    store = SqliteStore(path)
    write_all(store, [StoreBatch(messages=[message(properties={"k": "v"})])])
    store.close()
    with raw_connection(path) as raw:
        raw.execute("UPDATE messages SET properties = '{not json'")
    with pytest.raises(StoreError, match="unreadable properties"):
        recovered(path)


# -- wiring -----------------------------------------------------------------------------


def test_store_specs_and_options(path: Path) -> None:
    assert parse_store_spec(f"sqlite:{path}").location == str(path)
    with pytest.raises(ValueError, match="sqlite:PATH"):
        parse_store_spec("sqlite:")
    with pytest.raises(ValueError, match="sync"):
        SqliteStore(path, sync="sometimes")
    with pytest.raises(ValueError, match="sync"):
        BrokerConfig(store=f"sqlite:{path}", sync="sometimes")
    store = open_store(f"sqlite:{path}", dedup_window=12.5, sync="normal")
    try:
        assert isinstance(store, SqliteStore)
        assert (store.path, store.dedup_window, store.sync) == (str(path), 12.5, "normal")
        # PRAGMA synchronous: 1 is NORMAL, 2 is FULL.
        assert store._call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 1
    finally:
        store.close()
    store = SqliteStore(path)
    try:
        assert store._call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
        assert store._call(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
    finally:
        store.close()

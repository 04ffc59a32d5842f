"""The SQLite store's rows by the statement (``holdfast.broker.sqlite_rows``).

A batch's inserts, delivery counts and removals each run as statements of many rows,
not a statement a row: ``executemany`` hands the interpreter lock back and forth once
a row, and the writer thread then waits for the broker's busy event loop once a row.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from holdfast.broker import sqlite_rows, sqlite_schema
from holdfast.broker.dedup import BrokerClock
from holdfast.broker.sqlite_rows import CHUNK_BYTES, CHUNK_ROWS, prune_history, run_rows
from holdfast.broker.sqlite_schema import HISTORY_ROWS, REMOVED_ROWS
from holdfast.broker.sqlite_store import SqliteStore
from holdfast.broker.store import (
    CommitRecord,
    DeliveryUpdate,
    MessageKey,
    StoreBatch,
    StoredMessage,
    StoreError,
)
from holdfast.proto.policy import NO_POLICY, QueuePolicy
from tests.broker.test_sqlite_store import writer_held
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

QUEUE = "hf://test/rows"
CLOCK = BrokerClock()


def stored(count: int, uri: str = QUEUE) -> list[StoredMessage]:
    return [
        StoredMessage(uri, uuid.uuid4().bytes, f"m{i}".encode(), {}, CLOCK()) for i in range(count)
    ]


def write(store: SqliteStore, batch: StoreBatch) -> None:
    async def run() -> None:
        await asyncio.wait_for(store.write(batch), 30)

    asyncio.run(run())


def recovered(path: Path) -> list[tuple[bytes, int]]:
    store = SqliteStore(path)
    try:
        return [(m.payload, m.delivery_count) for m in store.recover().queues.get(QUEUE, [])]
    finally:
        store.close()


@pytest.mark.parametrize("count", [0, 1, 255, CHUNK_ROWS, CHUNK_ROWS + 1, 1000, 1023])
def test_rows_go_in_order_many_a_statement(count: int) -> None:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    connection.execute("CREATE TABLE history (queue_id, guid, accepted_at, digest)")
    statements: list[str] = []
    connection.set_trace_callback(statements.append)
    values: list[Any] = []
    for i in range(count):
        values += (1, i.to_bytes(4, "big"), float(i), i * 7)
    run_rows(connection, HISTORY_ROWS, values)
    connection.set_trace_callback(None)
    rows = connection.execute("SELECT * FROM history ORDER BY rowid").fetchall()
    assert rows == [(1, i.to_bytes(4, "big"), float(i), i * 7) for i in range(count)]
    # Whole chunks, then the rest by powers of two: never a statement a row.
    whole, rest = divmod(count, CHUNK_ROWS)
    assert len(statements) == whole + bin(rest).count("1")


def test_a_thousand_messages_go_in_and_out_in_order(path: Path, store: SqliteStore) -> None:
    messages = stored(1000)
    write(store, StoreBatch(messages=messages))
    removed = [MessageKey(QUEUE, m.guid) for m in messages[::3]]
    # Keys of no stored message, and a queue the store never saw, remove nothing.
    removed += [MessageKey(QUEUE, uuid.uuid4().bytes), MessageKey("hf://test/never", b"x" * 16)]
    write(store, StoreBatch(removed=removed))
    store.close()
    kept = [(m.payload, 0) for i, m in enumerate(messages) if i % 3]
    assert recovered(path) == kept


def test_delivery_counts_land_on_their_messages(path: Path, store: SqliteStore) -> None:
    messages = stored(600)
    write(store, StoreBatch(messages=messages))
    updates = [DeliveryUpdate(QUEUE, m.guid, 1 + i % 5) for i, m in enumerate(messages)]
    updates.append(DeliveryUpdate("hf://test/never", messages[0].guid, 9))
    write(store, StoreBatch(delivered=updates))
    store.close()
    assert recovered(path) == [(m.payload, 1 + i % 5) for i, m in enumerate(messages)]


def test_a_message_counted_twice_in_a_batch_is_one_row_of_the_update_with_the_last_count(
    path: Path, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite says an UPDATE ... FROM that matches a row twice uses either match: the
    # statement must never carry one message twice.
    messages = stored(3)
    write(store, StoreBatch(messages=messages))
    seen: list[list[Any]] = []

    def spy(connection: sqlite3.Connection, statement: Any, values: list[Any]) -> None:
        if statement is sqlite_schema.DELIVERY_ROWS:
            seen.append(list(values))
        run_rows(connection, statement, values)

    monkeypatch.setattr(sqlite_rows, "run_rows", spy)
    first, second = messages[0].guid, messages[1].guid
    updates = [
        DeliveryUpdate(QUEUE, first, 1),
        DeliveryUpdate(QUEUE, second, 1),
        DeliveryUpdate(QUEUE, first, 2),
        DeliveryUpdate(QUEUE, first, 3),
    ]
    write(store, StoreBatch(delivered=updates))
    store.close()
    assert len(seen) == 1
    keys = [tuple(seen[0][i + 1 : i + 3]) for i in range(0, len(seen[0]), 3)]
    assert sorted(keys) == sorted({(k[0], k[1]) for k in keys})
    assert [count for _, count in recovered(path)] == [3, 1, 0]


def test_a_removal_joins_through_the_index() -> None:
    # A row value IN a VALUES list scans the whole table: a CONFIRM would cost the depth.
    connection = sqlite3.connect(":memory:")
    for statement in sqlite_schema._SCHEMA:
        connection.execute(statement)
    plan = connection.execute(
        "EXPLAIN QUERY PLAN " + REMOVED_ROWS.sql(2), [1, b"a", 1, b"b"]
    ).fetchall()
    details = [row[-1] for row in plan]
    assert not any(d == "SCAN messages" or d == "SCAN m" for d in details), details
    assert any("USING COVERING INDEX messages_by_guid" in d for d in details), details


def test_an_old_sqlite_library_is_refused_in_one_line(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(StoreError, match=r"runs SQLite 3\.31\.1; the store needs 3\.33\.0"):
        SqliteStore(path)


# -- policies, deleted queues, a failed group, pruning ------------------------------------


def test_a_policy_set_on_a_new_queue_and_one_cleared_are_what_recovery_reads(
    path: Path, store: SqliteStore
) -> None:
    kept = "hf://test/policy-kept"
    cleared = "hf://test/policy-cleared"
    policy = QueuePolicy(max_deliveries=3)
    write(store, StoreBatch(policies=[(kept, policy), (cleared, policy)]))
    # An empty policy clears, whichever object it is (an operator's arrives parsed);
    # clearing the policy of a queue the store never saw is no error.
    assert QueuePolicy() == NO_POLICY and QueuePolicy() is not NO_POLICY
    write(store, StoreBatch(policies=[(cleared, QueuePolicy()), ("hf://test/never", NO_POLICY)]))
    store.close()
    reopened = SqliteStore(path)
    try:
        assert dict(reopened.recover().policies) == {kept: policy}
    finally:
        reopened.close()


def test_a_deleted_queue_takes_its_rows_and_an_unknown_one_takes_none(
    path: Path, store: SqliteStore
) -> None:
    doomed = stored(3, "hf://test/doomed")
    # The first queue the file ever holds: id 1, the id a wrong default would hit.
    kept = stored(2)
    write(store, StoreBatch(messages=kept))
    write(store, StoreBatch(messages=doomed))
    write(store, StoreBatch(deleted=["hf://test/doomed", "hf://test/never"]))
    store.close()
    reopened = SqliteStore(path)
    try:
        state = reopened.recover()
    finally:
        reopened.close()
    assert list(state.queues) == [QUEUE]
    assert {h.guid for h in state.history} == {m.guid for m in kept}


def test_a_deletion_in_a_failed_group_is_written_again_alone(path: Path) -> None:
    store = SqliteStore(path)
    doomed = "hf://test/deleted-in-a-failed-group"
    write(store, StoreBatch(messages=stored(2, doomed)))
    bad = StoredMessage(QUEUE, uuid.uuid4().bytes, cast(bytes, object()), {}, CLOCK())

    async def run() -> list[BaseException | None]:
        with writer_held(store):
            # One group: the bad batch fails its transaction, which had deleted the
            # queue; each batch is then written alone, the deletion included.
            futures = [
                store.write(StoreBatch(deleted=[doomed, "hf://test/never-seen"])),
                store.write(StoreBatch(messages=[bad])),
            ]
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
        return [r if isinstance(r, BaseException) else None for r in results]

    outcomes = asyncio.run(run())
    assert outcomes[0] is None
    assert isinstance(outcomes[1], StoreError)
    # A batch that fails after deleting a queue the store never saw leaves it unknown
    # (its forgotten commit record cannot be bound: the failure comes after the deletion).
    unbindable = CommitRecord(QUEUE, "app", cast(int, object()), b"d", 1)
    with pytest.raises(StoreError):
        write(store, StoreBatch(deleted=["hf://test/never-seen"], forgotten=[unbindable]))
    later = stored(1, "hf://test/never-seen")
    write(store, StoreBatch(messages=later))
    store.close()
    reopened = SqliteStore(path)
    try:
        queues = reopened.recover().queues
    finally:
        reopened.close()
    assert doomed not in queues
    assert [m.guid for m in queues["hf://test/never-seen"]] == [later[0].guid]


def test_a_backlog_of_expired_history_goes_chunk_after_chunk_without_waiting(
    path: Path,
) -> None:
    now = CLOCK()
    chunk = 300  # past the small ints CPython keeps one object of: counted, not the same
    old = [
        StoredMessage(QUEUE, uuid.uuid4().bytes, b"old", {}, now - 1000 + i / 1000)
        for i in range(3 * chunk + 1)
    ]
    # A whole chunk pruned means more may wait: the next goes at once, not an interval
    # (an hour here) later; once a chunk comes back short, the next look is that hour away.
    hour = 3600.0
    store = SqliteStore(path, dedup_window=60, prune_chunk=chunk, prune_interval=hour, clock=CLOCK)
    try:
        write(store, StoreBatch(messages=old))
        wait_until(lambda: store.pruned == len(old), 10, "the expired history pruned")
        wait_until(lambda: store._next_prune > CLOCK() + hour / 2, 10, "the next look an hour away")
    finally:
        store.close()


def test_history_accepted_at_the_cutoff_is_pruned_and_after_it_kept() -> None:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    connection.execute("CREATE TABLE history (queue_id, guid, accepted_at, digest)")
    connection.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID")
    for at in (99.0, 100.0, 101.0):
        connection.execute("INSERT INTO history VALUES (1, ?, ?, 0)", (str(at).encode(), at))
    assert prune_history(connection, 100.0, 10, now=130.0) == (2, False)
    assert connection.execute("SELECT accepted_at FROM history").fetchall() == [(101.0,)]
    # What the history still covers, and when it was pruned (the next run resumes there).
    assert dict(connection.execute("SELECT key, value FROM meta").fetchall()) == {
        "history_complete_since": 100.0,
        "history_pruned_at": 130.0,
    }


def test_big_payloads_go_in_statements_of_a_bounded_size(
    path: Path, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite copies each bound blob until its statement is done: a statement of message
    # rows binds at most CHUNK_BYTES of payload (one row when a payload alone is more).
    big = CHUNK_BYTES * 6 // 10
    messages = [
        StoredMessage(QUEUE, uuid.uuid4().bytes, bytes([i]) * big, {}, CLOCK()) for i in range(5)
    ]
    small = stored(3)
    statements: list[str] = []

    def traced(connection: sqlite3.Connection, statement: Any, values: list[Any]) -> None:
        if statement is sqlite_schema.MESSAGE_ROWS:
            statements.append(statement.sql(len(values) // statement.width))
            payloads = values[7 :: statement.width]
            assert len(payloads) == 1 or sum(map(len, payloads)) <= CHUNK_BYTES
        run_rows(connection, statement, values)

    monkeypatch.setattr(sqlite_rows, "run_rows", traced)
    write(store, StoreBatch(messages=[*small, *messages]))
    store.close()
    # The three small ones ride with the first big one; then one statement each.
    assert len(statements) == 5
    assert [payload for payload, _ in recovered(path)] == [
        *(m.payload for m in small),
        *(m.payload for m in messages),
    ]


def test_a_statement_binds_at_most_one_mib_of_payload(
    path: Path, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The documented bound, in numbers: ten payloads of 100 KiB fit in 1 MiB, eleven do
    # not, so 25 of them go as groups of 10, 10 and 5 rows (statements of 8 and 2, 8 and
    # 2, 4 and 1). A bound of 2 MiB would bind 16 rows at once; one of a few bytes, 1.
    messages = [
        StoredMessage(QUEUE, uuid.uuid4().bytes, bytes([i]) * 100 * 1024, {}, CLOCK())
        for i in range(25)
    ]
    bound: list[tuple[int, int]] = []

    def traced(connection: sqlite3.Connection, statement: Any, values: list[Any]) -> None:
        if statement is sqlite_schema.MESSAGE_ROWS:
            payloads = values[7 :: statement.width]
            bound.append((len(payloads), sum(map(len, payloads))))
        run_rows(connection, statement, values)

    monkeypatch.setattr(sqlite_rows, "run_rows", traced)
    write(store, StoreBatch(messages=messages))
    store.close()
    assert [rows for rows, _ in bound] == [10, 10, 5]
    assert max(size for _, size in bound) <= 1 << 20
    assert [payload for payload, _ in recovered(path)] == [m.payload for m in messages]


QUARTER = (1 << 20) // 4


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # The first statement filled to the byte, and the second after it too.
        ([QUARTER] * 8 + [1], [4, 4, 1]),
        # One byte past a full first statement starts the next.
        ([QUARTER] * 4 + [1], [4, 1]),
    ],
)
def test_payloads_that_fill_the_bound_exactly_share_a_statement(
    path: Path,
    store: SqliteStore,
    monkeypatch: pytest.MonkeyPatch,
    sizes: list[int],
    expected: list[int],
) -> None:
    # At most 1 MiB, to the byte, in every statement of a batch.
    messages = [
        StoredMessage(QUEUE, uuid.uuid4().bytes, bytes([i]) * size, {}, CLOCK())
        for i, size in enumerate(sizes)
    ]
    groups: list[int] = []

    def traced(connection: sqlite3.Connection, statement: Any, values: list[Any]) -> None:
        if statement is sqlite_schema.MESSAGE_ROWS:
            groups.append(len(values) // statement.width)
        run_rows(connection, statement, values)

    monkeypatch.setattr(sqlite_rows, "run_rows", traced)
    write(store, StoreBatch(messages=messages))
    store.close()
    assert groups == expected
    assert [payload for payload, _ in recovered(path)] == [m.payload for m in messages]

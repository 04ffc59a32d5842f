"""The policy rules on their own, without sockets: the registry with a settable clock,
the queue's hand-over points, the SDK's push-back and handler wrapper, the store."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import pytest

from holdfast.broker import MemoryStore
from holdfast.broker.deadletter import (
    NOTICE_DEFAULT_TTL_MS,
    NOTICE_MIN_TTL_MS,
    dead_copies,
    notice_ttl_ms,
)
from holdfast.broker.queues import Consumer, FlowLimits
from holdfast.broker.registry import IDLE_SCAN_INTERVAL, QueueRegistry
from holdfast.broker.sqlite_store import SqliteStore
from holdfast.broker.store import NO_PROPERTIES, StoreBatch, StoredMessage
from holdfast.proto import pb
from holdfast.proto.policy import NO_POLICY, QueuePolicy
from holdfast.proto.validate import Invalid
from holdfast.sdk import QueueOptions
from holdfast.sdk.frames import encode
from holdfast.sdk.handlers import reject_on_failure
from holdfast.sdk.outbound import RejectItem
from holdfast.sdk.types import Message, Rejection
from tests.broker.test_units import Clock, RecordingStore, Sink
from tests.support.columns import rejects_of

URI = "hf://t/q"
DLQ = "hf://t/dlq"


def stored(guid: bytes, at: float = 0.0) -> StoredMessage:
    return StoredMessage(URI, guid, b"x" * 10, NO_PROPERTIES, at)


async def turns(n: int = 3) -> None:
    """Run the loop turns a move takes (its store write, then the enqueue)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_an_idle_queue_is_dropped_once_its_history_has_expired() -> None:
    async def scenario() -> None:
        clock = Clock()
        registry = QueueRegistry(MemoryStore(), dedup_window=10.0, dedup_grace=0.0, clock=clock)
        queue = registry.open(URI)
        queue.history.record(b"g", 1, clock.now)
        registry.open("hf://t/never-used")
        assert registry.drop_idle(clock.now) == 1  # no history: goes at once
        assert registry.get(URI) is queue  # its GUID must still dedup a replay
        clock.now += 11
        assert registry.drop_idle(clock.now) == 1
        assert len(registry) == 0
        # Not dropped while anything is left: a handle, a message or a policy.
        for keep in ("handle", "message", "policy"):
            queue = registry.open(URI)
            if keep == "handle":
                queue.handles = 1
            elif keep == "message":
                queue.add(stored(b"m"))
            else:
                registry.set_policy(URI, QueuePolicy(ttl=5))
            assert registry.drop_idle(clock.now) == 0
            registry.delete(URI) if keep != "handle" else None
            queue.handles = 0
            registry.drop_idle(clock.now)
        assert IDLE_SCAN_INTERVAL > 0

    asyncio.run(scenario())


def test_a_message_returned_at_its_delivery_limit_is_buried_at_once() -> None:
    async def scenario() -> None:
        store = RecordingStore()
        registry = QueueRegistry(store)
        registry.set_policy(URI, QueuePolicy(max_deliveries=1, dead_letter=DLQ))
        queue = registry.open(URI)
        queue.add(stored(b"a"))
        consumer = Consumer(1, Sink(), FlowLimits())
        queue.attach(consumer)
        queue.detach(consumer)  # gone without confirming: delivery 1 of 1 was the last
        await turns()
        dlq = registry.get(DLQ)
        assert dlq is not None and [m.guid for m in dlq.ready] == [b"a"]
        assert not queue.live and not queue.ready
        move = next(b for b in store.batches if b.messages)
        assert [k.guid for k in move.removed] == [b"a"]  # removal and copy: one batch
        assert move.messages[0].properties["x-death-reason"] == "delivery-limit"

    asyncio.run(scenario())


def test_expiry_scans_only_the_expired_prefix() -> None:
    async def scenario() -> None:
        clock = Clock()
        registry = QueueRegistry(MemoryStore(), clock=clock)
        registry.set_policy(URI, QueuePolicy(ttl=5.0))
        queue = registry.open(URI)
        for i, age in enumerate((9, 6, 1)):
            queue.add(stored(b"%d" % i, clock.now - age))
        registry.sweep()
        await turns()
        assert [m.guid for m in queue.ready] == [b"2"]
        assert queue.dead["expired"] == 2
        assert registry.graveyard.dropped["expired"] == 2  # no dead-letter queue

    asyncio.run(scenario())


def test_a_full_queue_counts_in_flight_puts_and_bytes() -> None:
    registry = QueueRegistry(MemoryStore())
    registry.set_policy(URI, QueuePolicy(max_messages=2, max_bytes=25))
    queue = registry.open(URI)
    queue.add(stored(b"a"))
    assert not queue.full(1, 10)
    assert queue.full(1, 16)  # 10 + 16 > 25 bytes
    queue.in_flight[b"b"] = (None, 0)  # type: ignore[assignment]
    assert queue.full(1, 1)  # 1 live + 1 in flight + 1 > 2 messages


def test_policy_values_are_checked_and_round_trip() -> None:
    policy = QueuePolicy(max_deliveries=3, ttl=1.5, dead_letter=DLQ, max_messages=9, max_bytes=99)
    assert QueuePolicy.from_wire(policy.to_wire()) == policy
    assert QueuePolicy.from_json(policy.to_json()) == policy
    assert QueuePolicy.from_wire(pb.QueuePolicy()) == NO_POLICY and NO_POLICY.empty
    for bad in ({"max_deliveries": 0}, {"ttl": 0}, {"max_bytes": -1}, {"dead_letter": "x"}):
        with pytest.raises(Invalid):
            QueuePolicy(**bad)
    with pytest.raises(ValueError, match="unreadable queue policy"):
        QueuePolicy.from_json('{"ttl": "soon"}')


def test_a_version_2_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    SqliteStore(path).close()
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("DROP TABLE policies")
        raw.execute("UPDATE meta SET value = 2 WHERE key = 'schema_version'")
    raw.close()
    store = SqliteStore(path)
    try:
        assert store.recover().policies == {}

        async def write() -> None:
            await store.write(StoreBatch(policies=[(URI, QueuePolicy(ttl=3))]))

        asyncio.run(write())
    finally:
        store.close()
    reopened = SqliteStore(path)
    try:
        assert reopened.recover().policies == {URI: QueuePolicy(ttl=3)}
    finally:
        reopened.close()


def test_rejects_are_encoded_in_their_own_frame() -> None:
    item = RejectItem(3, b"g" * 16, False, 1500)
    ((frame, _),) = encode([item], 1 << 20, 0.0)
    (reject,) = rejects_of(frame.rejects)
    assert (reject.queue_id, reject.guid, reject.requeue, reject.delay_ms) == (
        3,
        b"g" * 16,
        False,
        1500,
    )


def test_a_raising_handler_rejects_with_a_growing_delay() -> None:
    settled: list[Rejection | None] = []

    def settle_message(message: Message, reject: Rejection | None = None) -> None:
        settled.append(reject)

    def failing(message: Message) -> None:
        raise ValueError("bad input")

    def confirming_then_failing(message: Message) -> None:
        message.confirm()
        raise ValueError("after the confirm")

    options = QueueOptions(retry_delay=0.5, retry_delay_max=3.0)
    for count in (1, 2, 3, 9):
        message = Message(uuid.uuid4(), b"", {}, count, URI, settle_message, 1, 1)
        reject_on_failure(failing, options)(message)
        assert message.settled
    assert settled == [Rejection(True, d) for d in (0.5, 1.0, 2.0, 3.0)]
    message = Message(uuid.uuid4(), b"", {}, 1, URI, settle_message, 1, 1)
    reject_on_failure(confirming_then_failing, options)(message)
    assert settled[-1] is None  # the confirm, and no reject after it


def test_what_a_dead_letter_and_its_notice_carry_after_one_and_two_moves() -> None:
    """A message dying for the first time names its queue, and an ``x-original-guid``
    it carried (from no move: it has no ``x-original-uri``) goes: its GUID there is its
    own. Dead-lettered again, it keeps the pair of its first move. A notice carries
    the dead message's pickup TTL, at least ``NOTICE_MIN_TTL_MS``, else the default."""
    guid = uuid.uuid4().bytes
    stray = {"x-original-guid": "ab" * 16, "x-dead-letter-notify": "hf://d/reply"}
    first, notice = dead_copies(
        StoredMessage("hf://d/q", guid, b"", stray, 0.0), "expired", "hf://d/q", "hf://d/dead", 1.0
    )
    assert first.properties["x-original-uri"] == "hf://d/q"
    assert "x-original-guid" not in first.properties
    assert notice.properties["x-ttl-ms"] == str(NOTICE_DEFAULT_TTL_MS)
    again = StoredMessage("hf://d/dead", guid, b"", {**first.properties, **stray}, 1.0)
    [second] = dead_copies(again, "rejected", "hf://d/dead", "hf://d/dead-2", 2.0)[:1]
    assert second.properties["x-original-uri"] == "hf://d/q"
    assert second.properties["x-original-guid"] == "ab" * 16
    assert second.properties["x-death-reason"] == "rejected"
    assert notice_ttl_ms({"x-ttl-ms": "5"}) == NOTICE_MIN_TTL_MS
    assert notice_ttl_ms({"x-ttl-ms": "3600001"}) == 3600001
    bad = {"x-original-uri": "not a uri"}
    [copy] = dead_copies(
        StoredMessage("hf://d/x", guid, b"", bad, 0.0), "expired", "hf://d/x", "hf://d/dead", 1.0
    )
    assert copy.properties["x-original-uri"] == "hf://d/x"
    # A PUT may name an x-original-uri (one its client may write): without the
    # x-death-reason of a move it is no dead letter, and it died first here.
    posted = {"x-original-uri": "hf://d/elsewhere"}
    [copy] = dead_copies(
        StoredMessage("hf://d/x", guid, b"", posted, 0.0), "expired", "hf://d/x", "hf://d/dead", 1.0
    )
    assert copy.properties["x-original-uri"] == "hf://d/x"

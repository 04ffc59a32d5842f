"""The broker's parts on their own, without sockets: history, queues, config."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from holdfast.broker import BrokerConfig, MemoryStore
from holdfast.broker.dedup import GuidHistory
from holdfast.broker.queues import Consumer, FlowLimits, Queue, QueueRegistry, Updates
from holdfast.broker.store import (
    NO_PROPERTIES,
    HistoryEntry,
    RecoveredState,
    StoreBatch,
    StoredMessage,
    open_store,
    parse_store_spec,
)
from holdfast.proto import pb


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


# -- GUID history -------------------------------------------------------------------


def test_history_forgets_a_guid_when_its_window_has_passed() -> None:
    clock = Clock()
    history = GuidHistory(window=10.0, clock=clock)
    history.record(b"a", clock.now)
    clock.now += 5
    history.record(b"b", clock.now)
    clock.now += 4.9
    assert b"a" in history and b"b" in history
    clock.now += 0.2  # a is 10.1 s old, b 5.1 s
    assert b"a" not in history
    assert b"b" in history
    clock.now += 5
    assert b"b" not in history


def test_history_keeps_the_original_acceptance_time_of_recovered_guids() -> None:
    clock = Clock()
    history = GuidHistory(window=300.0, clock=clock)
    history.record(b"recent", clock.now - 290)
    history.record(b"stale", clock.now - 301)
    assert b"recent" in history
    assert b"stale" not in history
    assert len(history) == 1  # an entry already expired is not kept at all
    clock.now += 11
    assert b"recent" not in history


def test_history_is_bounded_and_counts_what_it_forgot_early() -> None:
    clock = Clock()
    history = GuidHistory(window=300.0, max_guids=3, clock=clock)
    for guid in (b"1", b"2", b"3", b"4"):
        history.record(guid, clock.now)
    assert b"1" not in history
    assert all(g in history for g in (b"2", b"3", b"4"))
    assert history.evicted == 1


def test_history_rejects_a_window_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        GuidHistory(window=0)


# -- queues ---------------------------------------------------------------------------


class Sink:
    """Records PUSHes as (queue_id, guid, delivery_count)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, bytes, int]] = []

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        self.pushed.append((queue_id, message.guid, delivery_count))


class RecordingStore(MemoryStore):
    def __init__(self) -> None:
        self.batches: list[StoreBatch] = []

    def write(self, batch: StoreBatch) -> Any:
        self.batches.append(batch)
        return super().write(batch)


def message(guid: bytes, size: int = 10) -> StoredMessage:
    return StoredMessage("hf://t/q", guid, b"x" * size, NO_PROPERTIES, 0.0)


def make_queue(store: RecordingStore | None = None) -> Queue:
    return Queue("hf://t/q", GuidHistory(), Updates(store or RecordingStore()))


def test_queue_delivers_round_robin_within_limits() -> None:
    async def scenario() -> None:
        queue = make_queue()
        sink = Sink()
        a = Consumer(1, sink, FlowLimits(max_messages=2))
        b = Consumer(2, sink, FlowLimits(max_messages=10))
        queue.attach(a)
        queue.attach(b)
        queue.enqueue(message(bytes([i])) for i in range(6))
        queue.deliver()
        # a fills up after two; b takes the rest.
        assert [(q, g) for q, g, _ in sink.pushed] == [
            (1, b"\x00"),
            (2, b"\x01"),
            (1, b"\x02"),
            (2, b"\x03"),
            (2, b"\x04"),
            (2, b"\x05"),
        ]
        assert len(a.unconfirmed) == 2 and len(b.unconfirmed) == 4

    run(scenario())


def test_queue_byte_limit_stops_at_or_above_the_limit() -> None:
    async def scenario() -> None:
        queue = make_queue()
        sink = Sink()
        consumer = Consumer(1, sink, FlowLimits(max_bytes=25))
        queue.attach(consumer)
        queue.enqueue(message(bytes([i]), size=10) for i in range(5))
        queue.deliver()
        assert len(sink.pushed) == 3  # 0, 10, 20 < 25; at 30 it stops
        assert consumer.unconfirmed_bytes == 30
        assert queue.confirm(consumer, b"\x00")
        queue.deliver()
        assert len(sink.pushed) == 4
        # A single message bigger than the limit still goes to an empty consumer.
        big = Consumer(2, sink, FlowLimits(max_bytes=5))
        queue.detach(consumer)
        queue.attach(big)
        assert [g for q, g, _ in sink.pushed if q == 2] == [b"\x01"]

    run(scenario())


def test_detach_returns_messages_to_the_front_in_order_with_counts() -> None:
    async def scenario() -> None:
        store = RecordingStore()
        queue = make_queue(store)
        sink = Sink()
        consumer = Consumer(1, sink, FlowLimits())
        queue.enqueue(message(g) for g in (b"a", b"b", b"c"))
        queue.attach(consumer)
        assert queue.confirm(consumer, b"b")
        assert not queue.confirm(consumer, b"b")  # once only
        queue.enqueue([message(b"d")])  # arrives while a and c are out
        assert queue.detach(consumer, redeliver=False) == 2
        assert [m.guid for m in queue.ready] == [b"a", b"c", b"d"]
        assert [m.delivery_count for m in queue.ready] == [1, 1, 0]
        again = Consumer(2, sink, FlowLimits())
        queue.attach(again)
        assert sink.pushed[-3:] == [(2, b"a", 2), (2, b"c", 2), (2, b"d", 1)]
        await queue._updates.drain()
        removed = [key.guid for batch in store.batches for key in batch.removed]
        counts = [(u.guid, u.delivery_count) for b in store.batches for u in b.delivered]
        assert removed == [b"b"]
        assert counts == [(b"a", 1), (b"b", 1), (b"c", 1), (b"a", 2), (b"c", 2), (b"d", 1)]

    run(scenario())


def test_detaching_an_unknown_consumer_is_harmless() -> None:
    async def scenario() -> None:
        queue = make_queue()
        assert queue.detach(Consumer(1, Sink(), FlowLimits())) == 0

    run(scenario())


def test_registry_restores_messages_and_history() -> None:
    clock = Clock()
    registry = QueueRegistry(MemoryStore(), dedup_window=300.0, clock=clock)
    state = RecoveredState(
        queues={"hf://t/q": [message(b"a"), message(b"b")]},
        history=[
            HistoryEntry("hf://t/q", b"a", clock.now - 1),
            HistoryEntry("hf://t/other", b"x", clock.now - 1),
            HistoryEntry("hf://t/q", b"old", clock.now - 301),
        ],
    )
    assert registry.restore(state) == (2, 2)
    queue = registry.get("hf://t/q")
    assert queue is not None
    assert [m.guid for m in queue.ready] == [b"a", b"b"]
    assert b"a" in queue.history and b"old" not in queue.history
    other = registry.get("hf://t/other")
    assert other is not None and b"x" in other.history


def test_flow_limits_default_when_options_are_absent() -> None:
    assert FlowLimits.from_wire(None) == FlowLimits(1000, 32 * 1024 * 1024)
    assert FlowLimits.from_wire(pb.QueueOptions()) == FlowLimits(0, 0)


# -- configuration -----------------------------------------------------------------------


def test_store_specs() -> None:
    assert parse_store_spec("memory").kind == "memory"
    assert isinstance(open_store("memory"), MemoryStore)
    for spec in ("", "disk", "sqlite3:/x.db", "memory:extra"):
        with pytest.raises(ValueError, match="unknown store"):
            parse_store_spec(spec)


def test_config_checks_its_values() -> None:
    config = BrokerConfig(listen="127.0.0.1:0", dedup_window=1.5)
    assert config.limits.max_payload_bytes == config.max_payload_bytes
    assert config.limits.dedup_window == 1.5
    with pytest.raises(ValueError, match="HOST:PORT"):
        BrokerConfig(listen="localhost")
    with pytest.raises(ValueError, match="dedup_window"):
        BrokerConfig(dedup_window=0)
    with pytest.raises(ValueError, match="unknown store"):
        BrokerConfig(store="tape")

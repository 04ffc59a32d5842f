"""The broker's parts on their own, without sockets: history, queues, config."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from holdfast.broker import BrokerConfig, MemoryStore
from holdfast.broker.dedup import BrokerClock, GuidHistory, HistoryBudget, content_digest
from holdfast.broker.queues import Consumer, FlowLimits, Queue
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.store import (
    NO_PROPERTIES,
    HistoryEntry,
    RecoveredState,
    StoreBatch,
    StoredMessage,
)
from holdfast.broker.stores import open_store, parse_store_spec
from holdfast.broker.updates import Updates
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


def test_history_keeps_a_guid_for_window_plus_grace_and_forgets_it_after() -> None:
    clock = Clock()
    history = GuidHistory(window=10.0, grace=2.0, clock=clock)
    history.record(b"a", 1, clock.now)
    clock.now += 5
    history.record(b"b", 2, clock.now)
    clock.now += 6.9  # a is 11.9 s old: past the window, inside the grace
    history.expire()
    assert history.get(b"a") == 1 and history.get(b"b") == 2
    clock.now += 0.2 + history.retention / 128  # a is past window + grace + one bucket
    history.expire()
    assert b"a" not in history
    assert b"b" in history
    clock.now += 5
    history.expire()
    assert b"b" not in history
    assert history.budget.held == 0


def test_history_keeps_the_original_acceptance_time_of_recovered_guids() -> None:
    clock = Clock()
    history = GuidHistory(window=300.0, grace=0.0, clock=clock)
    history.record(b"stale", 0, clock.now - 301)
    history.record(b"recent", 0, clock.now - 290)
    assert b"recent" in history
    assert b"stale" not in history
    assert len(history) == 1  # an entry already expired is not kept at all
    clock.now += 11 + history.retention / 128
    history.expire()
    assert b"recent" not in history


def test_history_never_evicts_and_counts_against_the_shared_budget() -> None:
    clock = Clock()
    budget = HistoryBudget(max_guids=3)
    first = GuidHistory(window=300.0, budget=budget, clock=clock)
    second = GuidHistory(window=300.0, budget=budget, clock=clock)
    first.record(b"1", 0, clock.now)
    first.record(b"2", 0, clock.now)
    assert not budget.full()
    second.record(b"3", 0, clock.now)
    assert budget.full()
    assert all(g in first for g in (b"1", b"2")) and b"3" in second
    clock.now += 330 + first.retention / 128
    assert first.expire() == 2 and second.expire() == 1
    assert not budget.full()


def test_broker_clock_is_monotonic_and_resumes_from_a_persisted_time() -> None:
    monotonic = Clock(50.0)
    clock = BrokerClock(monotonic)
    assert clock() == 0.0
    monotonic.now += 2
    assert clock() == 2.0
    clock.resume(1000.0)  # a store persisted times up to 1000 in an earlier run
    assert clock() == 1000.0
    clock.resume(10.0)  # an earlier time never moves the clock back
    monotonic.now += 1
    assert clock() == 1001.0


def test_a_wall_clock_step_does_not_expire_history(monkeypatch: pytest.MonkeyPatch) -> None:
    monotonic = Clock(7.0)
    clock = BrokerClock(monotonic)
    history = GuidHistory(window=10.0, grace=0.0, clock=clock)
    history.record(b"a", 0, clock())
    # The wall clock jumps a day ahead (NTP, an operator): the broker never reads it.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)
    monotonic.now += 9
    assert history.expire() == 0 and b"a" in history


def test_content_digest_is_stable_and_sees_payload_and_properties() -> None:
    base = content_digest(b"p", {"a": "1", "b": "2"})
    assert base == content_digest(b"p", {"b": "2", "a": "1"})  # order does not matter
    assert base != content_digest(b"q", {"a": "1", "b": "2"})
    assert base != content_digest(b"p", {"a": "1", "b": "3"})
    assert base != content_digest(b"p", {"a": "12", "b": ""})  # length-prefixed
    assert content_digest(b"p", {}) == content_digest(b"p", NO_PROPERTIES)
    assert -(2**63) <= base < 2**63  # fits SQLite's INTEGER


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

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        raise AssertionError("only a Redis node that lost its lease revokes deliveries")


class RecordingStore(MemoryStore):
    def __init__(self) -> None:
        self.batches: list[StoreBatch] = []

    def write(self, batch: StoreBatch) -> Any:
        self.batches.append(batch)
        return super().write(batch)


def message(guid: bytes, size: int = 10) -> StoredMessage:
    return StoredMessage("hf://t/q", guid, b"x" * size, NO_PROPERTIES, 0.0)


async def pushes_leave() -> None:
    """Let the turn of the loop end: PUSHes leave once their delivery counts are
    handed to the store (at once for a store whose writes are done)."""
    await asyncio.sleep(0)


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
        await pushes_leave()
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
        await pushes_leave()
        assert len(sink.pushed) == 3  # 0, 10, 20 < 25; at 30 it stops
        assert consumer.unconfirmed_bytes == 30
        assert queue.confirm(consumer, b"\x00")
        queue.deliver()
        await pushes_leave()
        assert len(sink.pushed) == 4
        # A single message bigger than the limit still goes to an empty consumer.
        big = Consumer(2, sink, FlowLimits(max_bytes=5))
        queue.detach(consumer)
        queue.attach(big)
        await pushes_leave()
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
        await pushes_leave()
        assert sink.pushed[-3:] == [(2, b"a", 2), (2, b"c", 2), (2, b"d", 1)]
        await queue._updates.drain()
        removed = [key.guid for batch in store.batches for key in batch.removed]
        counts = [(u.guid, u.delivery_count) for b in store.batches for u in b.delivered]
        assert removed == [b"b"]
        assert counts == [(b"a", 1), (b"b", 1), (b"c", 1), (b"a", 2), (b"c", 2), (b"d", 1)]

    run(scenario())


class HeldStore(MemoryStore):
    """A store whose writes complete only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[None]] = []

    def write(self, batch: StoreBatch) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future


def test_a_push_leaves_only_once_its_delivery_count_is_durable() -> None:
    async def scenario() -> None:
        store = HeldStore()
        queue = Queue("hf://t/q", GuidHistory(), Updates(store))
        sink = Sink()
        consumer = Consumer(1, sink, FlowLimits())
        queue.enqueue([message(b"a"), message(b"b")])
        queue.attach(consumer)
        await pushes_leave()
        assert len(store.pending) == 1 and sink.pushed == []  # count not durable yet
        # The consumer leaves and comes back before the first write is durable: the
        # stale PUSH (count 1) never leaves, the redelivery counts 2.
        queue.detach(consumer)
        queue.attach(consumer)
        await pushes_leave()
        store.pending[0].set_result(None)
        await pushes_leave()
        await pushes_leave()
        assert sink.pushed == []
        store.pending[1].set_result(None)
        await pushes_leave()
        await pushes_leave()
        assert sink.pushed == [(1, b"a", 2), (1, b"b", 2)]

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
            HistoryEntry("hf://t/q", b"old", clock.now - 331, 0),
            HistoryEntry("hf://t/q", b"a", clock.now - 1, 0),
            HistoryEntry("hf://t/other", b"x", clock.now - 1, 0),
        ],
    )
    assert registry.restore(state) == (2, 2)
    queue = registry.get("hf://t/q")
    assert queue is not None
    assert [m.guid for m in queue.ready] == [b"a", b"b"]
    assert set(queue.live) == {b"a", b"b"}  # known while they live, whatever the window
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


@pytest.mark.parametrize("in_flight", [0, 1])
def test_the_depth_limit_counts_live_and_in_flight_messages_and_bytes_exactly(
    in_flight: int,
) -> None:
    """``Queue.full`` at its edges: messages and bytes already live, those whose store
    write is in flight, and the PUT asking, against ``max_messages`` and ``max_bytes``."""
    from holdfast.proto.policy import QueuePolicy

    queue = make_queue()
    queue.policy = QueuePolicy(max_messages=4, max_bytes=100)
    queue.enqueue(message(bytes([i]), size=20) for i in range(2))  # 2 live, 40 bytes
    loop = asyncio.new_event_loop()
    try:
        for i in range(in_flight):
            queue.in_flight[bytes([100 + i])] = (loop.create_future(), 0)
            queue.in_flight_bytes += 20
        room = 4 - 2 - in_flight
        assert not queue.full(room, 10)
        assert queue.full(room + 1, 10)
        left = 100 - 40 - 20 * in_flight
        assert not queue.full(1, left)
        assert queue.full(1, left + 1)
        assert not queue.full(0, 0)
    finally:
        loop.close()
    queue.policy = QueuePolicy(max_bytes=100)
    assert not queue.full(1000, 60 - 20 * in_flight) and queue.full(1, 61 - 20 * in_flight)
    queue.policy = QueuePolicy(max_messages=4)
    assert not queue.full(2 - in_flight, 10**9) and queue.full(3 - in_flight, 0)


def test_pushes_leave_at_once_on_the_memory_store_which_gets_no_records() -> None:
    """The memory store keeps nothing, so ``Updates`` builds no removal or delivery
    records for it; its PUSHes still leave at the end of the turn, counted right."""

    async def scenario() -> None:
        queue = Queue("hf://t/q", GuidHistory(), Updates(MemoryStore()))
        sink = Sink()
        consumer = Consumer(1, sink, FlowLimits(max_messages=2))
        queue.attach(consumer)
        queue.enqueue(message(bytes([i])) for i in range(3))
        queue.deliver()
        await pushes_leave()
        assert [(g, count) for _, g, count in sink.pushed] == [(b"\x00", 1), (b"\x01", 1)]
        assert queue.confirm_run(consumer, [b"\x00", b"\x07"]) == [b"\x07"]
        queue.deliver()
        await pushes_leave()
        assert [g for _, g, _ in sink.pushed] == [b"\x00", b"\x01", b"\x02"]
        assert queue.detach(consumer, redeliver=False) == 2

    run(scenario())

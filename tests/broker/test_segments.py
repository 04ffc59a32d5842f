"""Packed ready messages (``holdfast.broker.segments`` and ``ready``): any sequence of
queue operations on a ``ReadyMessages`` and its ``LiveMessages`` sees what a plain
deque of ``StoredMessage`` and a dict by GUID would, message for message; a ``Queue``
fed packed batches delivers, requeues, expires and purges as one fed objects; and a PUT
finds a packed GUID whether the history still holds it or not."""

from __future__ import annotations

import itertools
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from holdfast.broker.dedup import GuidHistory
from holdfast.broker.queues import Queue
from holdfast.broker.ready import LiveMessages, ReadyMessages
from holdfast.broker.segments import SEGMENT_MESSAGES
from holdfast.broker.store import NO_PROPERTIES, StoredMessage
from holdfast.proto.policy import PICKUP_TTL, QueuePolicy
from tests.broker.queue_kit import Graveyard, Sink, SyncUpdates, consumers, make

_serial = itertools.count()


def fresh(at: float = 100.0, size: int | None = None, props: bool = False) -> StoredMessage:
    """A never-delivered message with a unique 16-byte GUID."""
    number = next(_serial)
    payload = bytes([number % 251]) * (number % 7 if size is None else size)
    properties = {"k": str(number)} if props else NO_PROPERTIES
    return StoredMessage("hf://t/q", number.to_bytes(16, "big"), payload, properties, at, 0, number)


def fields(message: StoredMessage) -> tuple[object, ...]:
    return (
        message.queue_uri,
        message.guid,
        message.payload,
        dict(message.properties),
        message.accepted_at,
        message.delivery_count,
        message.digest,
    )


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("pack"), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("append"), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("extendleft"), st.integers(1, 3), st.booleans()),
        st.tuples(
            st.sampled_from(["popleft", "pop", "head", "drain", "remove"]),
            st.integers(0, 5),
            st.booleans(),
        ),
        st.tuples(st.just("take_front"), st.integers(0, 50), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_packed_ready_messages_behave_as_a_deque_of_objects(
    ops: list[tuple[str, int, bool]],
) -> None:
    objects: dict[bytes, StoredMessage] = {}
    ready = ReadyMessages(objects)
    # The broker records every packed GUID in the history when it accepts it.
    history = GuidHistory(clock=lambda: 100.0)
    live = LiveMessages(objects, ready, history)
    model: deque[StoredMessage] = deque()
    model_live: dict[bytes, StoredMessage] = {}
    for op, n, flag in ops:
        if op == "pack":
            batch = [fresh(props=flag and i % 3 == 0) for i in range(n)]
            history.record_new([m.guid for m in batch], [m.digest for m in batch], 100.0)
            ready.pack(batch)
            model.extend(batch)
            model_live.update((m.guid, m) for m in batch)
        elif op in ("append", "extendleft"):
            batch = [fresh() for _ in range(n)]
            for message in batch:
                live[message.guid] = message
                model_live[message.guid] = message
            if op == "append":
                for message in batch:
                    ready.append(message)
                model.extend(batch)
            else:
                ready.extendleft(batch)
                model.extendleft(batch)
        elif not model:
            assert not ready
        elif op == "popleft":
            assert fields(ready.popleft()) == fields(model.popleft())
        elif op == "pop":
            assert fields(ready.pop()) == fields(model.pop())
        elif op == "take_front":
            taken = ready.take_front(n)
            expected = [model.popleft() for _ in range(min(n, len(model)))]
            assert [fields(m) for m in taken] == [fields(m) for m in expected]
            assert all(objects[m.guid] is m for m in taken)
        elif op == "head":
            head = ready[0]
            assert fields(head) == fields(model[0]) and live.objects[head.guid] is head
            assert ready[0] is head  # made an object once, in place
        elif op == "drain":
            assert [fields(m) for m in ready.drain()] == [fields(m) for m in model]
            model.clear()
        elif op == "remove":
            target = model[n % len(model)]
            if target.guid in objects:
                ready.remove(objects[target.guid])
                model.remove(target)
        assert len(ready) == len(model) and bool(ready) == bool(model)
        assert [fields(m) for m in ready] == [fields(m) for m in model]
        assert len(live) == len(model_live) and set(live) == set(model_live)
        # A message taken out is an object, in ``objects``, until the queue forgets it.
        assert ready.packed + len(objects) == len(model_live)
    for guid in model_live:
        assert guid in live
    assert fresh().guid not in live


def test_segments_fill_up_and_seal() -> None:
    objects: dict[bytes, StoredMessage] = {}
    ready = ReadyMessages(objects)
    batch = [fresh(size=10) for _ in range(SEGMENT_MESSAGES + 500)]
    for start in range(0, len(batch), 100):
        ready.pack(batch[start : start + 100])
    assert len(ready) == len(batch) and ready.packed == len(batch) and not objects
    assert [m.guid for m in ready] == [m.guid for m in batch]
    first = [ready.popleft() for _ in range(SEGMENT_MESSAGES + 1)]
    assert [m.guid for m in first] == [m.guid for m in batch[: SEGMENT_MESSAGES + 1]]
    # The head's next few are made objects with it, and stay first in line.
    assert ready.packed + len(objects) == len(batch) and len(objects) > SEGMENT_MESSAGES
    assert [m.guid for m in ready] == [m.guid for m in batch[SEGMENT_MESSAGES + 1 :]]


def test_a_batch_with_a_pickup_ttl_or_an_odd_guid_stays_objects() -> None:
    ready = ReadyMessages({})
    short = StoredMessage("hf://t/q", b"short", b"", NO_PROPERTIES, 1.0)
    assert not ready.pack([fresh(), short]) and not ready
    pickup = fresh()
    pickup.properties = {PICKUP_TTL: "100"}
    assert not ready.pack([fresh(), pickup]) and not ready
    assert ready.pack([fresh(props=True), fresh()]) and ready.packed == 2


def test_a_queue_fed_packed_batches_keeps_every_rule() -> None:
    """FIFO delivery, requeue to the front with the next count, TTL expiry in order,
    depth and bytes, purge: as with objects."""
    queue, clock, updates = make(Graveyard())
    batch = [fresh(size=5) for _ in range(6)]
    queue.enqueue_recorded(batch)
    assert queue.ready.packed == 6 and len(queue.live) == 6 and queue.live_bytes == 30
    assert queue.oldest_accepted_at() == 100.0 and queue.full(0, 0) is False
    sink = Sink()
    (consumer,) = consumers(sink, 1, room=2)
    queue.attach(consumer)
    assert [guid for _, guid, _ in sink.pushed] == [m.guid for m in batch[:2]]
    assert len(queue.ready) == 4 and len(queue.live) == 6
    queue.detach(consumer)
    assert [m.guid for m in queue.ready] == [m.guid for m in batch]
    assert [m.delivery_count for m in queue.ready] == [1, 1, 0, 0, 0, 0]
    queue.policy = QueuePolicy(ttl=10.0)
    clock.now = 111.0
    assert queue.expire(clock.now) == 6 and not queue.live and queue.live_bytes == 0
    queue.enqueue_recorded([fresh(size=3) for _ in range(4)])
    assert len(queue.purge()) == 4 and not queue.live and not queue.ready
    assert updates.counts == [(batch[0].guid, 1), (batch[1].guid, 1)]


def test_a_put_knows_a_packed_guid_after_the_history_let_it_go() -> None:
    history = GuidHistory(window=10.0, grace=0.0, clock=lambda: 100.0)
    queue = Queue("hf://t/q", history, SyncUpdates())
    known = queue.live.known_digest
    old, young = fresh(at=100.0), fresh(at=150.0)
    for message in (old, young):
        history.record(message.guid, message.digest, message.accepted_at)
        queue.enqueue_recorded([message])
    assert known(old.guid, 105.0) == old.digest
    assert history.expire(155.0) == 1 and old.guid not in history
    assert known(old.guid, 155.0) == old.digest  # aged: from elders
    assert known(young.guid, 155.0) == young.digest  # from the history
    assert known(fresh().guid, 155.0) is None
    delivered = queue.ready.popleft()  # leaves the segment: an object now
    assert delivered.guid == old.guid and known(old.guid, 155.0) == old.digest
    queue.forget(delivered)
    assert known(old.guid, 155.0) is None  # gone: elders' entry is stale


def test_take_front_crosses_objects_and_segments_and_lets_an_emptied_segment_go() -> None:
    objects: dict[bytes, StoredMessage] = {}
    ready = ReadyMessages(objects)
    first, second = [fresh(at=100.0) for _ in range(3)], [fresh(at=100.0) for _ in range(3)]
    ready.pack(first)
    ready.pack(second)  # joins the same open segment
    given_back = [fresh() for _ in range(2)]
    for message in given_back:
        objects[message.guid] = message
    ready.extendleft(reversed(given_back))
    assert ready.check_from == 100.0  # an unaged segment waits
    # Two objects, then three of the segment: never more than asked.
    taken = ready.take_front(5)
    assert [m.guid for m in taken] == [m.guid for m in given_back + first]
    assert len(ready) == 3 and ready.packed == 3
    assert [m.guid for m in ready.take_front(10)] == [m.guid for m in second]
    # The emptied segment no longer waits to age with its buffers.
    assert not ready and ready.packed == 0 and ready.check_from == float("inf")

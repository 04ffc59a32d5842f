"""More of the memory store's ``Queue`` rule by rule (``test_queue_rules.py`` is the
first part): a pickup deadline checked at delivery before any tick has buried the
message, and packed enqueueing. Each pins a line that
``make mutation``'s ``queues`` target found unpinned."""

from __future__ import annotations

from holdfast.broker.store import StoredMessage
from holdfast.proto.policy import REASON_EXPIRED
from tests.broker.queue_kit import Graveyard, Sink, consumers, make, msg


def test_a_missed_pickup_deadline_is_checked_at_delivery_before_any_tick() -> None:
    graveyard = Graveyard()
    queue, clock, _ = make(graveyard)
    queue.enqueue([msg(b"late", at=100.0, pickup_ms=1000), msg(b"plain", at=100.0)])
    clock.now = 101.5  # past the deadline; expire_pickups has not run
    sink = Sink()
    [consumer] = consumers(sink, 1, room=2)
    queue.attach(consumer)
    assert graveyard.buried == [(b"late", REASON_EXPIRED)]
    assert [guid for _, guid, _ in sink.pushed] == [b"plain"]


def _accepted(guid: bytes, size: int) -> StoredMessage:
    return StoredMessage("hf://t/q", guid, b"p" * size, {}, 100.0)


def test_recorded_messages_are_enqueued_packed_once_in_order() -> None:
    queue, _, _ = make()
    batch = [_accepted(bytes([n]) * 16, 10 + n) for n in range(3)]
    queue.enqueue_recorded(batch)
    assert queue.ready.packed == 3
    assert [m.guid for m in queue.ready] == [m.guid for m in batch]
    assert queue.live_bytes == 10 + 11 + 12


def test_recorded_messages_that_cannot_be_packed_are_enqueued_as_objects_once() -> None:
    queue, _, _ = make()
    batch = [msg(b"a", size=3), msg(b"b", size=5)]  # GUIDs of other lengths stay objects
    queue.enqueue_recorded(batch)
    assert queue.ready.packed == 0
    assert [m.guid for m in queue.ready] == [b"a", b"b"]
    assert queue.live_bytes == 8

"""The memory store's ``Queue`` rule by rule, with no event loop and no store: round-robin
turns across detaches, what a detach or a reject gives back, reject delays and pickup
deadlines at their edges, the counters the metrics read, and what ``idle``,
``oldest_accepted_at``, ``take_ready`` and ``purge`` see. ``make mutation`` runs these
first for the ``queues`` target: each pins a rule a one-token change would break."""

from __future__ import annotations

import pytest

from holdfast.broker.consumers import Consumer, FlowLimits
from holdfast.broker.store import StoredMessage
from holdfast.proto.policy import (
    REASON_DELIVERY_LIMIT,
    REASON_EXPIRED,
    REASON_REJECTED,
    QueuePolicy,
)
from tests.broker.queue_kit import Graveyard, Sink, consumers, make, msg


def test_a_fresh_queue_is_empty_idle_and_counts_nothing() -> None:
    queue, _, _ = make()
    assert queue.idle and not queue.live and not queue.ready and not queue.delayed
    assert (queue.accepted, queue.pushed, queue.redelivered, queue.dedup_hits) == (0, 0, 0, 0)
    assert (queue.rejected, queue.live_bytes, queue.in_flight_bytes, queue.handles) == (0, 0, 0, 0)
    assert not queue.dead and queue.oldest_accepted_at() is None and not queue.own_policy


@pytest.mark.parametrize("gone", [0, 1, 2])
def test_round_robin_goes_on_with_the_next_consumer_after_a_detach(gone: int) -> None:
    """Three consumers; then one leaves (what it held goes back first): the turn goes
    on where it would have, skipping only the consumer that left."""
    queue, _, _ = make()
    sink = Sink()
    a, b, c = consumers(sink, 3)
    for consumer in (a, b, c):
        queue.attach(consumer)
    queue.enqueue(msg(bytes([i])) for i in range(4))  # a, b, c, a: b is next
    queue.deliver()
    assert [q for q, _, _ in sink.pushed] == [0, 1, 2, 0]
    queue.detach((a, b, c)[gone], redeliver=False)
    sink.pushed.clear()
    queue.enqueue(msg(bytes([10 + i])) for i in range(3))
    queue.deliver()
    expected = {0: [1, 2, 1, 2, 1], 1: [2, 0, 2, 0], 2: [1, 0, 1, 0]}[gone]
    assert [q for q, _, _ in sink.pushed] == expected


def test_detaching_the_last_in_turn_wraps_to_the_first() -> None:
    queue, _, _ = make()
    sink = Sink()
    a, b, c = consumers(sink, 3)
    for consumer in (a, b, c):
        queue.attach(consumer)
    queue.enqueue([msg(b"1"), msg(b"2")])
    queue.deliver()  # a and b took one each: c is next
    queue.detach(c)
    queue.enqueue([msg(b"3")])
    queue.deliver()
    assert [q for q, _, _ in sink.pushed] == [0, 1, 0]


def test_round_robin_wraps_over_many_consumers() -> None:
    queue, _, _ = make()
    sink = Sink()
    many = consumers(sink, 300, room=2)
    for consumer in many:
        queue.attach(consumer)
    queue.enqueue(msg(i.to_bytes(2, "big")) for i in range(299))
    queue.deliver()  # the last consumer is next; it leaves
    queue.detach(many[-1])
    queue.enqueue(msg(i.to_bytes(2, "big")) for i in range(299, 302))
    queue.deliver()
    assert [q for q, _, _ in sink.pushed] == [*range(299), 0, 1, 2]
    queue, _, _ = make()
    sink = Sink()
    for consumer in consumers(sink, 300, room=2):
        queue.attach(consumer)
    queue.enqueue(msg(i.to_bytes(2, "big")) for i in range(302))
    queue.deliver()  # past the last consumer, back to the first
    assert [q for q, _, _ in sink.pushed] == [*range(300), 0, 1]


def test_detach_gives_back_what_the_consumer_held_and_resets_it() -> None:
    queue, _, updates = make()
    sink = Sink()
    [consumer] = consumers(sink, 1)
    queue.attach(consumer)
    queue.enqueue([msg(b"a", size=3), msg(b"b", size=5)])
    queue.deliver()
    assert consumer.unconfirmed_bytes == 8
    assert queue.detach(consumer, redeliver=False) == 2
    assert not consumer.unconfirmed and consumer.unconfirmed_bytes == 0
    assert [m.guid for m in queue.ready] == [b"a", b"b"] and queue.consumers == ()
    assert queue.detach(consumer) == 0  # once only
    other = Consumer(7, sink, FlowLimits())
    queue.attach(other)
    assert queue.detach(other, redeliver=True) == 2
    assert [m.guid for m in queue.ready] == [b"a", b"b"]  # nobody left to deliver to
    assert updates.counts == [(b"a", 1), (b"b", 1), (b"a", 2), (b"b", 2)]


def test_detach_with_redeliver_hands_the_messages_to_the_others_at_once() -> None:
    queue, _, _ = make()
    sink = Sink()
    a, b = consumers(sink, 2, room=1)
    queue.attach(a)
    queue.enqueue([msg(b"m")])
    queue.deliver()
    queue.attach(b)
    assert queue.detach(a) == 1
    assert sink.pushed[-1] == (1, b"m", 2) and b.unconfirmed_bytes == 4
    assert queue.redelivered == 1 and queue.pushed == 2


def test_counters_count_each_push_redelivery_and_reject_once() -> None:
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    sink = Sink()
    [consumer] = consumers(sink, 1)
    queue.attach(consumer)
    queue.enqueue([msg(b"a"), msg(b"b")])
    queue.deliver()
    assert (queue.pushed, queue.redelivered, queue.rejected) == (2, 0, 0)
    assert queue.reject(consumer, b"a", requeue=True, delay=0.0)
    queue.deliver()
    assert (queue.pushed, queue.redelivered, queue.rejected) == (3, 1, 1)
    assert queue.reject(consumer, b"b", requeue=False, delay=0.0)
    assert not queue.reject(consumer, b"b", requeue=False, delay=0.0)
    assert queue.rejected == 2 and queue.dead == {REASON_REJECTED: 1}
    assert graveyard.buried == [(b"b", REASON_REJECTED)]
    assert set(queue.live) == {b"a"} and queue.live_bytes == 4


@pytest.mark.parametrize("late", [0.0, 7.5])  # timers fire late on a busy loop
def test_a_reject_delay_ends_exactly_delay_seconds_later(late: float) -> None:
    queue, clock, _ = make()
    sink = Sink()
    [consumer] = consumers(sink, 1)
    queue.attach(consumer)
    queue.enqueue([msg(b"a")])
    queue.deliver()
    clock.now = 1000.0
    assert queue.reject(consumer, b"a", requeue=True, delay=2.5)
    assert [e[2].guid for e in queue.delayed] == [b"a"] and not queue.ready
    assert not queue.idle and queue._timed == {queue}
    assert queue.release_due(1002.49) == 0
    assert queue.release_due(1002.5 + late) == 1  # due from the instant the delay ends
    assert sink.pushed[-1] == (0, b"a", 2) and not queue.delayed


def test_delayed_messages_come_back_in_due_order_before_the_ready_ones() -> None:
    queue, clock, _ = make()
    sink = Sink()
    [consumer] = consumers(sink, 1, room=2)
    queue.attach(consumer)
    queue.enqueue([msg(b"a"), msg(b"b")])
    queue.deliver()
    assert queue.reject(consumer, b"b", requeue=True, delay=1.0)
    assert queue.reject(consumer, b"a", requeue=True, delay=1.0)
    queue.detach(consumer, redeliver=False)
    queue.enqueue([msg(b"c")])
    assert queue.release_due(clock.now + 1.0) == 2
    assert [m.guid for m in queue.ready] == [b"b", b"a", b"c"]
    queue.attach(consumer)  # takes b and a again
    assert queue.reject(consumer, b"a", requeue=True, delay=5.0)
    assert queue.reject(consumer, b"b", requeue=True, delay=1.0)
    assert queue.release_due(clock.now + 1.0) == 1  # the earliest due, whatever the order
    assert [e[2].guid for e in queue.delayed] == [b"a"]


def test_a_reject_with_no_positive_delay_requeues_at_once() -> None:
    queue, _, _ = make()
    sink = Sink()
    [consumer] = consumers(sink, 1, room=1)
    queue.attach(consumer)
    queue.enqueue([msg(b"a")])
    queue.deliver()
    assert queue.reject(consumer, b"a", requeue=True, delay=-1.0)
    queue.deliver()
    assert not queue.delayed and sink.pushed[-1] == (0, b"a", 2)


def test_the_release_guards_apply_with_only_a_limit_or_only_a_ttl() -> None:
    for policy, reason in (
        (QueuePolicy(max_deliveries=1), REASON_DELIVERY_LIMIT),
        (QueuePolicy(ttl=5.0), REASON_EXPIRED),
    ):
        graveyard = Graveyard()
        queue, clock, updates = make(graveyard)
        queue.policy = policy
        sink = Sink()
        [consumer] = consumers(sink, 1)
        queue.attach(consumer)
        queue.enqueue([msg(b"a", at=clock.now)])
        queue.deliver()
        clock.now += 5.0
        assert queue.reject(consumer, b"a", requeue=True, delay=0.0)
        assert graveyard.buried == [(b"a", reason)] and queue.dead == {reason: 1}
        assert not queue.ready and not queue.live and updates.counts == [(b"a", 1)]


def test_the_delivery_guards_apply_with_only_a_limit_or_only_a_ttl() -> None:
    for policy, count, reason in (
        (QueuePolicy(max_deliveries=2), 2, REASON_DELIVERY_LIMIT),
        (QueuePolicy(ttl=5.0), 0, REASON_EXPIRED),
    ):
        graveyard = Graveyard()
        queue, clock, _ = make(graveyard)
        queue.policy = policy
        sink = Sink()
        message = msg(b"a", at=clock.now)
        message.delivery_count = count
        queue.enqueue([message, msg(b"b", at=clock.now + 1)])
        clock.now += 5.0
        queue.attach(consumers(sink, 1)[0])
        assert graveyard.buried == [(b"a", reason)]
        assert sink.pushed == [(0, b"b", 1)]  # the next one is delivered instead


def test_a_queue_without_a_graveyard_drops_and_records_its_dead() -> None:
    queue, clock, updates = make(None)
    queue.policy = QueuePolicy(ttl=1.0)
    queue.enqueue([msg(b"a", size=6, at=clock.now), msg(b"b", size=2, at=clock.now + 5)])
    assert queue.expire(clock.now + 1.0) == 1
    assert updates.removals == [b"a"] and set(queue.live) == {b"b"} and queue.live_bytes == 2
    assert queue.dead == {REASON_EXPIRED: 1}
    assert queue.expire(clock.now + 1.0) == 0 and queue.expire(clock.now + 6.0) == 1


def test_expiry_stops_at_the_first_message_within_its_ttl() -> None:
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    assert queue.expire(1e9) == 0  # no TTL, nothing expires
    queue.policy = QueuePolicy(ttl=10.0)
    queue.enqueue([msg(b"a", at=100.0), msg(b"b", at=103.0), msg(b"c", at=101.0)])
    assert queue.expire(112.0) == 1  # b is still within: c waits behind it
    assert [m.guid for m in queue.ready] == [b"b", b"c"]


def test_expiry_steps_over_released_messages_within_their_ttl() -> None:
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    queue.policy = QueuePolicy(ttl=10.0)
    newer, other = msg(b"n", at=105.0), msg(b"o", at=104.0)
    newer.delivery_count = other.delivery_count = 1
    # Released ones went back to the front, ahead of an older never-delivered one.
    queue.enqueue([newer, other, msg(b"a", at=100.0), msg(b"b", at=103.0), msg(b"c", at=101.0)])
    assert queue.expire(112.0) == 1  # a, behind the two released ones; b stops the scan
    assert [m.guid for m in queue.ready] == [b"n", b"o", b"b", b"c"]
    assert graveyard.buried == [(b"a", REASON_EXPIRED)]


def test_a_pickup_deadline_is_acceptance_plus_its_milliseconds() -> None:
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    other = StoredMessage("hf://t/q", b"o", b"x", {"k": "v"}, 100.0)
    queue.add(other)  # properties, but no pickup TTL: no deadline
    assert not queue.pickups and not queue._timed
    queue.forget(queue.ready.popleft())
    queue.enqueue([msg(b"a", at=100.0, pickup_ms=2500), msg(b"b", at=100.0, pickup_ms=4000)])
    assert queue._timed == {queue} and not queue.idle
    assert queue.expire_pickups(102.4999) == 0
    assert queue.expire_pickups(102.5) == 1
    assert graveyard.buried == [(b"a", REASON_EXPIRED)] and queue.dead == {REASON_EXPIRED: 1}
    assert [m.guid for m in queue.ready] == [b"b"] and len(queue.pickups) == 1


def test_a_pickup_deadline_spares_what_was_picked_up_or_is_gone() -> None:
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    sink = Sink()
    [consumer] = consumers(sink, 1, room=2)
    queue.enqueue(msg(g, at=100.0, pickup_ms=1000) for g in (b"held", b"delayed", b"gone"))
    queue.attach(consumer)  # takes held and delayed
    assert queue.reject(consumer, b"delayed", requeue=True, delay=60.0)
    queue.forget(queue.ready[0])  # gone (moved away) while still listed
    queue.enqueue([msg(b"late", at=100.0, pickup_ms=1000)])
    assert queue.expire_pickups(101.0) == 1
    assert graveyard.buried == [(b"late", REASON_EXPIRED)]
    assert not queue.pickups and b"held" in consumer.unconfirmed


def test_forget_counts_bytes_once() -> None:
    queue, _, _ = make()
    a = msg(b"a", size=7)
    queue.add(a)
    queue.add(msg(b"b", size=3))
    queue.forget(a)
    queue.forget(a)
    assert queue.live_bytes == 3 and set(queue.live) == {b"b"}


def test_purge_and_take_ready_cover_ready_and_delayed_not_held() -> None:
    queue, _, _ = make()
    sink = Sink()
    [consumer] = consumers(sink, 1, room=2)
    queue.enqueue([msg(b"h"), msg(b"d", pickup_ms=9000), msg(b"r", pickup_ms=9000)])
    queue.attach(consumer)
    assert queue.reject(consumer, b"d", requeue=True, delay=9.0)
    taken = queue.take_ready()
    assert [m.guid for m in taken] == [b"r", b"d"] and set(queue.live) == {b"h", b"d", b"r"}
    assert not queue.ready and not queue.delayed
    queue.requeue_front(taken)
    queue.detach(consumer, redeliver=False)
    queue.delayed.append((1e9, 0, queue.ready.pop()))
    assert [m.guid for m in queue.purge()] == [b"h", b"r", b"d"]
    assert not queue.live and not queue.pickups and queue.live_bytes == 0


def test_idle_needs_no_handle_message_flight_delay_or_own_policy() -> None:
    queue, _, _ = make()
    queue.handles = 1
    assert not queue.idle
    queue.handles = 0
    queue.own_policy = True
    assert not queue.idle
    queue.own_policy = False
    queue.in_flight[b"x"] = (None, 0)  # type: ignore[assignment]
    assert not queue.idle
    queue.in_flight.clear()
    queue.delayed.append((1.0, 0, msg(b"d")))
    assert not queue.idle
    queue.delayed.clear()
    assert queue.idle


def test_oldest_accepted_at_looks_at_ready_delayed_and_held() -> None:
    queue, _, _ = make()
    sink = Sink()
    a, b = consumers(sink, 2, room=1)
    queue.attach(a)
    queue.attach(b)
    queue.enqueue([msg(b"1", at=50.0), msg(b"2", at=60.0), msg(b"3", at=70.0), msg(b"4", at=5.0)])
    queue.deliver()  # a holds 1 (50), b holds 2 (60); ready: 3 (70), 4 (5)
    assert queue.unconfirmed == 2
    assert queue.oldest_accepted_at() == 50.0  # only the head of ready counts
    assert queue.reject(b, b"2", requeue=True, delay=10.0)
    queue.delayed[0] = (queue.delayed[0][0], 0, msg(b"2", at=40.0))
    assert queue.oldest_accepted_at() == 40.0
    queue.delayed.clear()
    queue.ready.clear()
    assert queue.oldest_accepted_at() == 50.0
    queue.enqueue([msg(b"5", at=20.0)])
    assert queue.oldest_accepted_at() == 20.0
    # Held messages are in delivery order: the first one a consumer holds counts.
    queue.detach(a, redeliver=False)
    queue.detach(b, redeliver=False)
    queue.ready.clear()
    wide = Consumer(9, sink, FlowLimits(max_messages=2))
    queue.attach(wide)
    queue.enqueue([msg(b"6", at=65.0), msg(b"7", at=1.0)])
    queue.deliver()
    assert list(wide.unconfirmed) == [b"6", b"7"] and queue.unconfirmed == 2
    assert queue.oldest_accepted_at() == 65.0


def test_a_pickup_deadline_skips_a_message_being_moved_and_goes_on() -> None:
    """A message taken out for a move (``take_ready``) is live but not ready: its
    deadline passes it by, and the messages due after it are still looked at."""
    graveyard = Graveyard()
    queue, _, _ = make(graveyard)
    queue.enqueue([msg(b"moving", pickup_ms=1000), msg(b"waiting", pickup_ms=1000)])
    _, waiting = queue.take_ready()
    queue.requeue_front([waiting])
    assert queue.expire_pickups(101.0) == 1
    assert graveyard.buried == [(b"waiting", REASON_EXPIRED)] and b"moving" in queue.live


def test_one_consumer_takes_while_under_both_limits_and_no_more() -> None:
    """The rule ``delivery.to_one`` runs by the batch: a message goes while the
    consumer holds fewer messages and fewer payload bytes than its limits."""
    queue, _, _ = make()
    queue.enqueue([msg(bytes([n]) * 16, size=5) for n in range(6)])
    sink = Sink()
    consumer = Consumer(0, sink, FlowLimits(max_messages=10, max_bytes=10))
    queue.attach(consumer)
    # 0 then 5 bytes held before each: two go, holding exactly the limit; no third.
    assert [guid[0] for _, guid, _ in sink.pushed] == [0, 1]
    assert consumer.unconfirmed_bytes == 10 and len(queue.ready) == 4
    queue.deliver()
    assert len(sink.pushed) == 2
    assert queue.confirm(consumer, bytes([0]) * 16)
    queue.deliver()
    assert [guid[0] for _, guid, _ in sink.pushed] == [0, 1, 2]
    assert queue.pushed == 3 and consumer.unconfirmed_bytes == 10


def test_one_consumer_paused_or_full_gets_nothing() -> None:
    for limits in (FlowLimits(0, 100), FlowLimits(10, 0), FlowLimits(2, 100)):
        queue, _, _ = make()
        queue.enqueue([msg(bytes([n]) * 16, size=5) for n in range(4)])
        sink = Sink()
        consumer = Consumer(0, sink, limits)
        queue.attach(consumer)
        assert len(sink.pushed) == min(limits.max_messages, 4 if limits.max_bytes else 0)
        queue.deliver()  # paused or full: nothing more, and nothing counted
        assert queue.pushed == len(sink.pushed) == len(consumer.unconfirmed)
        assert queue.redelivered == 0


def test_a_run_of_confirms_settles_what_is_held_and_returns_the_rest_in_order() -> None:
    def g(n: int) -> bytes:
        return bytes([n]) * 16

    queue, _, updates = make()
    queue.enqueue([msg(g(n), size=5) for n in range(4)])
    assert queue.live_bytes == 20
    sink = Sink()
    (consumer,) = consumers(sink, 1, room=3)
    queue.attach(consumer)  # holds 0, 1 and 2; 3 waits
    # 3 is not held (ready), the second 1 is settled already, 9 is unknown.
    assert queue.confirm_run(consumer, [g(1), g(3), g(0), g(1), g(9)]) == [g(3), g(1), g(9)]
    assert updates.removals == [g(1), g(0)]
    assert list(consumer.unconfirmed) == [g(2)] and consumer.unconfirmed_bytes == 5
    assert len(queue.live) == 2 and queue.live_bytes == 10 and g(3) in queue.live
    assert queue.confirm_run(consumer, [g(2)]) == [] and queue.live_bytes == 5
    assert queue.confirm_run(consumer, []) == [] and updates.removals == [g(1), g(0), g(2)]


def test_one_consumer_over_lowered_limits_gets_nothing_until_under_both() -> None:
    queue, _, _ = make()
    queue.enqueue([msg(bytes([n]) * 16, size=5) for n in range(6)])
    sink = Sink()
    (consumer,) = consumers(sink, 1, room=3)
    queue.attach(consumer)
    consumer.limits = FlowLimits(max_messages=1, max_bytes=4)  # a ConfigureQueue lowered them
    queue.deliver()
    assert len(sink.pushed) == 3
    for n in (0, 1):
        assert queue.confirm(consumer, bytes([n]) * 16)
    queue.deliver()  # holds 1 message of 5 bytes: at the message limit, over the bytes
    assert len(sink.pushed) == 3
    consumer.limits = FlowLimits(max_messages=5, max_bytes=4)
    queue.deliver()  # room for messages, none for bytes
    assert len(sink.pushed) == 3
    consumer.limits = FlowLimits(max_messages=5, max_bytes=6)
    queue.deliver()  # 5 bytes held, under 6: one more
    assert len(sink.pushed) == 4


def test_one_consumer_at_its_message_limit_takes_one_more_per_confirm() -> None:
    queue, _, _ = make()
    queue.enqueue([msg(bytes([n]) * 16) for n in range(6)])
    sink = Sink()
    (consumer,) = consumers(sink, 1, room=4)
    queue.attach(consumer)
    assert len(sink.pushed) == 4
    assert queue.confirm(consumer, bytes([0]) * 16)
    queue.deliver()  # room for 4 - 3 = 1
    assert len(sink.pushed) == 5 and len(consumer.unconfirmed) == 4


def test_round_robin_and_a_guarded_queue_count_each_push_and_redelivery_once() -> None:
    queue, _, _ = make()
    sink = Sink()
    first, second, third = consumers(sink, 3)
    for consumer in (first, second, third):
        queue.attach(consumer)
    queue.enqueue([msg(b"a"), msg(b"b"), msg(b"c")])
    queue.deliver()
    assert (queue.pushed, queue.redelivered) == (3, 0)
    assert queue.detach(first) == 1  # a goes to the two left, round-robin
    assert (queue.pushed, queue.redelivered) == (4, 1)
    assert [count for _, _, count in sink.pushed] == [1, 1, 1, 2]
    # One consumer on a guarded queue takes the round-robin path too.
    guarded, _, _ = make()
    guarded.policy = QueuePolicy(max_deliveries=5)
    (only,) = consumers(sink, 1)
    guarded.attach(only)
    guarded.enqueue([msg(b"x")])
    guarded.deliver()
    assert guarded.reject(only, b"x", requeue=True, delay=0.0)
    guarded.deliver()
    assert (guarded.pushed, guarded.redelivered) == (2, 1)

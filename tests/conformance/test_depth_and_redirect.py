"""Depth limits and redirects, on every store, directly and through the proxy.

A PUT past a queue's ``max_messages`` or ``max_bytes`` is pushed back (``QUEUE_FULL``):
no outcome, the SDK keeps it and retries, and it goes in, once, when there is room.
A queue whose policy redirects it has its PUTs enqueued in the target instead, and a
replay of one is deduplicated there."""

from __future__ import annotations

import time
import uuid

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import AckStatus, BrokerBusyError, Message
from holdfast.sdk.types import Ack
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def fill_past(world: World, policy: QueuePolicy, payloads: list[bytes], taken: int) -> None:
    """Post ``payloads`` to a queue with ``policy``: the first ``taken`` are ACKed, the
    rest wait (no outcome) until a consumer makes room, then go in once each."""
    uri = world.uri("deep")
    world.admin.set_policy(uri, policy)
    acks: list[Ack] = []
    with world.session() as session:
        queue = session.open_queue(uri, write=True, on_ack=acks.append)
        guids = [queue.post(p) for p in payloads]
        wait_until(lambda: len(acks) >= taken, 15, f"{taken} ACKs")
        # The rest is pushed back, not refused: no outcome while the queue is full.
        assert not session.flush(timeout=0.5)
        assert len(acks) == taken
        assert sorted(m.payload for m in peek(world, uri)) == sorted(payloads[:taken])
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(uri, read=True, on_message=inbox)
        assert session.flush(timeout=20), "the pushed-back PUTs never went in"
        inbox.wait(len(payloads))
    assert {a.guid: a.status for a in acks} == {g: AckStatus.SUCCESS for g in guids}
    assert sorted(m.payload for m in inbox.messages) == sorted(payloads)
    assert peek(world, uri) == []


def test_a_put_past_max_messages_waits_for_room_and_goes_in_once(world: World) -> None:
    fill_past(world, QueuePolicy(max_messages=2), [b"a", b"b", b"c", b"d"], 2)


def test_a_put_past_max_bytes_waits_for_room_and_goes_in_once(world: World) -> None:
    payloads = [b"x" * 100, b"y" * 100, b"z" * 100]
    fill_past(world, QueuePolicy(max_bytes=250), payloads, 2)


def test_a_put_that_fills_max_bytes_exactly_goes_in_and_one_byte_more_waits(
    world: World,
) -> None:
    # The limit is inclusive: bytes + payload > max_bytes is full, == is not. With a
    # limit of one byte the first one-byte PUT fills the queue and the second waits.
    fill_past(world, QueuePolicy(max_bytes=1), [b"a", b"b"], 1)


def test_the_depth_limit_counts_what_consumers_hold(world: World) -> None:
    uri = world.uri("held")
    world.admin.set_policy(uri, QueuePolicy(max_messages=1))
    with world.session() as session:
        assert post_and_wait(session, uri, b"held") is AckStatus.SUCCESS
        inbox = Inbox()
        reader = session.open_queue(uri, read=True, on_message=inbox)
        [message] = inbox.wait(1)
        acks: list[Ack] = []
        session.open_queue(uri, write=True, on_ack=acks.append).post(b"next")
        # The held message still counts: no room until it is confirmed.
        assert not session.flush(timeout=0.5)
        message.confirm()
        assert session.flush(timeout=20)
        assert [a.status for a in acks] == [AckStatus.SUCCESS]
        assert [m.payload for m in inbox.wait(2)] == [b"held", b"next"]
        reader.close()


def test_a_redirected_queue_puts_into_its_target_and_dedups_there(world: World) -> None:
    uri, target = world.uri("redirected"), world.uri("target")
    world.admin.set_policy(uri, QueuePolicy(redirect=target))
    guid = uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"moved", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"moved", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"changed", guid=guid) is AckStatus.CONFLICT
        [message] = wait_ready(world, target, 1)
        assert (message.guid, message.payload) == (guid.bytes, b"moved")
        assert peek(world, uri) == []
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(target, read=True, on_message=inbox)
        [delivered] = inbox.wait(1)
    assert isinstance(delivered, Message) and delivered.payload == b"moved"
    assert delivered.delivery_count == 1
    wait_ready(world, target, 0)


def test_a_queue_with_a_policy_of_its_own_is_not_redirected_by_a_template(world: World) -> None:
    tag = uuid.uuid4().hex[:8]
    template, orphans = f"hf://conformance/pool{tag}.key-*", world.uri("orphans")
    bound = f"hf://conformance/pool{tag}.key-bound"
    world.admin.set_policy(template, QueuePolicy(redirect=orphans))
    world.admin.set_policy(bound, QueuePolicy(max_deliveries=5))
    with world.session() as session:
        assert post_and_wait(session, f"hf://conformance/pool{tag}.key-a", b"a").ok
        assert post_and_wait(session, bound, b"b").ok
    assert [m.payload for m in wait_ready(world, orphans, 1)] == [b"a"]
    assert [m.payload for m in wait_ready(world, bound, 1)] == [b"b"]


def test_a_post_to_a_queue_pushed_back_waits_then_raises_broker_busy(world: World) -> None:
    """Rule 7 on the broker's push-back, directly and through the proxy (which relays
    QUEUE_FULL to its client rather than keep the PUT): ``post()`` waits 5 s, then
    raises ``BrokerBusyError`` and takes nothing; the kept PUT goes in once."""
    uri = world.uri("busy")
    world.admin.set_policy(uri, QueuePolicy(max_messages=1))
    acks: list[Ack] = []
    with world.session() as session:
        queue = session.open_queue(uri, write=True, on_ack=acks.append)
        kept = [queue.post(b"a"), queue.post(b"b")]
        wait_until(lambda: len(acks) == 1, 15, "one ACK")
        wait_until(lambda: session.stats().buffered_puts == 1, 15, "the second kept")
        started = time.monotonic()
        with pytest.raises(BrokerBusyError):
            queue.post(b"refused")
        assert time.monotonic() - started >= 4.5
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(uri, read=True, on_message=inbox)
        assert session.flush(timeout=20)
        inbox.wait(2)
    assert sorted(a.guid for a in acks) == sorted(kept)
    assert sorted(m.payload for m in inbox.messages) == [b"a", b"b"]


def test_a_replay_to_a_full_queue_is_acked_as_a_replay_not_pushed_back(world: World) -> None:
    """A replay is decided before the depth limit (``lifecycle.admit``): QUEUE_FULL (and
    HISTORY_FULL) answer only a GUID the broker holds no copy of, which is why the SDK
    may count a pushed-back PUT's age from the push-back (``PutBuffer.hold``)."""
    uri = world.uri("full-replay")
    world.admin.set_policy(uri, QueuePolicy(max_messages=1))
    guid = uuid.uuid4()
    first: list[Ack] = []
    again: list[Ack] = []
    with world.session() as session:
        queue = session.open_queue(uri, write=True)
        queue.post(b"only", guid=guid, on_ack=first.append)
        assert session.flush(timeout=15)
        queue.post(b"only", guid=guid, on_ack=again.append)  # the queue is full now
        assert session.flush(timeout=15), "the replay was pushed back"
    assert [(a.guid, a.status) for a in first + again] == [(guid, AckStatus.SUCCESS)] * 2
    assert [m.payload for m in peek(world, uri)] == [b"only"]

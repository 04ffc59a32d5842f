"""TTL and reject delays on every store, directly and through the proxy, on the broker's
manual clock: TTL is counted from acceptance; a held message does not expire while held
and is dead-lettered ``expired`` when released after its TTL; a delayed reject holds a
message back for its delay; a pickup TTL (``x-ttl-ms``) ends a message nobody took."""

from __future__ import annotations

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import AckStatus, QueueOptions
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]

TTL = 10.0


def with_ttl(world: World) -> tuple[str, str]:
    uri, dead = world.uri("ttl"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(ttl=TTL, dead_letter=dead))
    return uri, dead


def dead_reasons(world: World, dead: str) -> list[str]:
    return [m.properties["x-death-reason"] for m in peek(world, dead)]


def test_a_ready_message_expires_at_its_ttl_and_not_before(world: World) -> None:
    uri, dead = with_ttl(world)
    with world.session() as session:
        assert post_and_wait(session, uri, b"stale") is AckStatus.SUCCESS
    world.time.advance(TTL - 1)
    # A message within its TTL is delivered: the clock step alone ends nothing.
    with world.session() as session:
        inbox = Inbox(lambda m: m.reject(requeue=True, delay=0.0))
        queue = session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(1)
        queue.close()
    wait_ready(world, uri, 1)
    assert peek(world, dead) == []
    world.time.advance(1)
    wait_ready(world, dead, 1)
    assert dead_reasons(world, dead) == ["expired"]
    assert peek(world, uri) == []


def test_a_held_message_does_not_expire_while_held_and_confirms_normally(world: World) -> None:
    uri, dead = with_ttl(world)
    with world.session() as session:
        assert post_and_wait(session, uri, b"slow work") is AckStatus.SUCCESS
        inbox = Inbox()
        session.open_queue(uri, read=True, on_message=inbox)
        [message] = inbox.wait(1)
        world.time.advance(TTL * 5)
        # Sweeps run meanwhile; a held message is not theirs to expire.
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 1, 5, "still held")
        message.confirm()
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "confirmed")
    assert peek(world, dead) == [] and peek(world, uri) == []


def test_a_held_message_released_after_its_ttl_is_dead_lettered_not_redelivered(
    world: World,
) -> None:
    uri, dead = with_ttl(world)
    with world.session() as producer:
        assert post_and_wait(producer, uri, b"held too long") is AckStatus.SUCCESS
    second = Inbox()
    with world.session() as other:
        with world.session() as first_session:
            first = Inbox()
            first_session.open_queue(uri, read=True, on_message=first)
            first.wait(1)
            world.time.advance(TTL + 5)
            # A second consumer waits; the message is held, so it gets nothing yet.
            other.open_queue(uri, read=True, on_message=second)
        # The first session closed holding it, past its TTL: dead, not redelivered.
        wait_ready(world, dead, 1)
        assert dead_reasons(world, dead) == ["expired"]
        assert second.messages == []
        assert peek(world, uri) == []


def test_a_delayed_reject_holds_the_message_back_for_its_delay(world: World) -> None:
    uri = world.uri("delayed")
    with world.session() as session:
        assert post_and_wait(session, uri, b"later") is AckStatus.SUCCESS
        inbox = Inbox(
            lambda m: m.reject(requeue=True, delay=30.0) if m.delivery_count == 1 else m.confirm()
        )
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(1)
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "the reject")
        world.time.advance(29)
        assert len(inbox.messages) == 1
        world.time.advance(1.5)
        second = inbox.wait(2)[1]
        assert second.delivery_count == 2


def test_a_pickup_ttl_ends_a_message_nobody_took(world: World) -> None:
    uri, dead = world.uri("pickup"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    with world.session() as session:
        status = post_and_wait(session, uri, b"request", properties={"x-ttl-ms": "5000"})
        assert status is AckStatus.SUCCESS
    world.time.advance(4)
    wait_ready(world, uri, 1)
    world.time.advance(1.5)
    wait_ready(world, dead, 1)
    assert dead_reasons(world, dead) == ["expired"]


def test_a_message_past_its_pickup_deadline_is_dead_lettered_not_delivered(
    world: World,
) -> None:
    # The consumer is full while the deadline passes; its confirm makes room, and the
    # delivery that follows at once (before any sweep) must bury it, not hand it out:
    # a request nobody picked up in time never runs (the table's deliver/pickup-missed
    # row; the memory and sqlite stores delivered it until the next sweep).
    uri, dead = world.uri("pickup-late"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    with world.session() as session:
        inbox = Inbox()
        options = QueueOptions(max_unconfirmed_messages=1)
        session.open_queue(uri, read=True, on_message=inbox, options=options)
        assert post_and_wait(session, uri, b"first") is AckStatus.SUCCESS
        first = inbox.wait(1)[0]
        late = post_and_wait(session, uri, b"request", properties={"x-ttl-ms": "5000"})
        assert late is AckStatus.SUCCESS
        world.time.advance(6)
        first.confirm()
        wait_ready(world, dead, 1)
        assert dead_reasons(world, dead) == ["expired"]
        assert [m.payload for m in inbox.messages] == [b"first"]


def test_a_ready_message_expires_behind_a_newer_one_that_came_back(world: World) -> None:
    # A released message goes to the front, so the ready list is not in acceptance
    # order: the sweep must still find the older message behind it.
    uri, dead = with_ttl(world)
    with world.session() as producer:
        consumer = world.session()
        try:
            inbox = Inbox()
            consumer.open_queue(
                uri, read=True, on_message=inbox, options=QueueOptions(max_unconfirmed_messages=1)
            )
            assert post_and_wait(producer, uri, b"older") is AckStatus.SUCCESS
            inbox.wait(1)[0].reject(requeue=True, delay=5.0)
            wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "the reject")
            world.time.advance(2.5)
            assert post_and_wait(producer, uri, b"newer") is AckStatus.SUCCESS
            assert inbox.wait(2)[1].payload == b"newer"
            world.time.advance(2.5)  # the older one's delay is over; the consumer is full
            wait_ready(world, uri, 1)
        finally:
            consumer.close(timeout=2)
    # The newer one, released, goes in front of the older one.
    assert [m.payload for m in wait_ready(world, uri, 2)] == [b"newer", b"older"]
    world.time.advance(6)  # the older one is past its TTL, the newer one is not
    [letter] = wait_ready(world, dead, 1)
    assert (letter.payload, letter.properties["x-death-reason"]) == (b"older", "expired")
    assert [m.payload for m in peek(world, uri)] == [b"newer"]

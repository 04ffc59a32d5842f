"""The delivery limit, on every store, directly and through the proxy: a message is
delivered exactly ``max_deliveries`` times, whether each delivery ends in a reject with
requeue or in the loss of its consumer's session, and then dead-lettered once with
``x-death-reason: delivery-limit``, its original URI and its delivery count."""

from __future__ import annotations

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import AckStatus, Message
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]

LIMIT = 3


def limited(world: World) -> tuple[str, str]:
    uri, dead = world.uri("limited"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(max_deliveries=LIMIT, dead_letter=dead))
    return uri, dead


def assert_dead_once(world: World, dead: str, uri: str, reason: str, count: int) -> None:
    [letter] = wait_ready(world, dead, 1)
    assert letter.properties["x-death-reason"] == reason
    assert letter.properties["x-original-uri"] == uri
    assert letter.properties["x-delivery-count"] == str(count)
    assert peek(world, uri) == []


def test_reject_with_requeue_delivers_exactly_the_limit_then_dead_letters_once(
    world: World,
) -> None:
    uri, dead = limited(world)
    with world.session() as session:
        assert post_and_wait(session, uri, b"poison") is AckStatus.SUCCESS
        inbox = Inbox(lambda m: m.reject(requeue=True))
        session.open_queue(uri, read=True, on_message=inbox)
        assert_dead_once(world, dead, uri, "delivery-limit", LIMIT)
        assert inbox.counts() == list(range(1, LIMIT + 1))


def test_session_loss_counts_like_a_reject_and_ends_at_the_limit(world: World) -> None:
    uri, dead = limited(world)
    with world.session() as producer:
        assert post_and_wait(producer, uri, b"crashes its consumer") is AckStatus.SUCCESS
    seen: list[int] = []
    for delivery in range(1, LIMIT + 1):
        with world.session() as consumer:
            inbox = Inbox()
            consumer.open_queue(uri, read=True, on_message=inbox)
            [message] = inbox.wait(1)
            seen.append(message.delivery_count)
        # The session closed holding it: released, counted, and at the limit dead.
        if delivery < LIMIT:
            wait_ready(world, uri, 1)
    assert seen == [1, 2, 3]
    assert_dead_once(world, dead, uri, "delivery-limit", LIMIT)


def test_below_the_limit_a_reject_redelivers_and_without_requeue_dead_letters(
    world: World,
) -> None:
    uri, dead = limited(world)
    with world.session() as session:
        assert post_and_wait(session, uri, b"once more") is AckStatus.SUCCESS

        def settle(message: Message) -> None:
            if message.delivery_count == 1:
                message.reject(requeue=True)
            else:
                message.reject(requeue=False)

        inbox = Inbox(settle)
        session.open_queue(uri, read=True, on_message=inbox)
        assert_dead_once(world, dead, uri, "rejected", 2)
        assert inbox.counts() == [1, 2]

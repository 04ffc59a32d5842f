"""Across a broker restart, on every durable store, directly and through the proxy: a
message's delivery count only grows and a confirmed message stays gone (rule 9), and a
replay of a GUID accepted before the restart is still a duplicate (rule 8)."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import AckStatus
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def test_delivery_count_only_grows_across_a_restart(restarted_world: World) -> None:
    world = restarted_world
    uri = world.uri()
    with world.session() as session:
        assert post_and_wait(session, uri, b"survives") is AckStatus.SUCCESS
        inbox = Inbox()
        queue = session.open_queue(uri, read=True, on_message=inbox)
        assert [m.delivery_count for m in inbox.wait(1)] == [1]
        queue.close()
    wait_ready(world, uri, 1)
    world.broker.restart()
    [message] = wait_ready(world, uri, 1)
    assert message.delivery_count == 1
    with world.session() as session:
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(uri, read=True, on_message=inbox)
        assert [m.delivery_count for m in inbox.wait(1)] == [2]


def test_confirmed_messages_stay_gone_across_a_restart(restarted_world: World) -> None:
    world = restarted_world
    uri = world.uri("confirmed")
    with world.session() as session:
        for payload in (b"m0", b"m1", b"m2", b"m3"):
            assert post_and_wait(session, uri, payload) is AckStatus.SUCCESS
        inbox = Inbox(lambda m: m.confirm() if m.payload in (b"m0", b"m2") else None)
        queue = session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(4)
        session.flush(timeout=15)
        queue.close()
    assert [m.payload for m in wait_ready(world, uri, 2)] == [b"m1", b"m3"]
    world.broker.restart()
    assert [m.payload for m in wait_ready(world, uri, 2)] == [b"m1", b"m3"]


def test_a_guid_accepted_before_a_restart_is_still_known_after_it(restarted_world: World) -> None:
    world = restarted_world
    uri, guid = world.uri(), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"once", guid=guid) is AckStatus.SUCCESS
    world.broker.restart()
    with world.session() as session:
        assert post_and_wait(session, uri, b"once", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"other", guid=guid) is AckStatus.CONFLICT
    assert [m.payload for m in wait_ready(world, uri, 1)] == [b"once"]


def test_delivery_counts_kept_across_a_restart_make_the_limit_hold_across_it(
    restarted_world: World,
) -> None:
    world = restarted_world
    uri, dead = world.uri("limit"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(max_deliveries=3, dead_letter=dead))
    with world.session() as session:
        assert post_and_wait(session, uri, b"twice before") is AckStatus.SUCCESS
        inbox = Inbox(lambda m: m.reject(requeue=True) if m.delivery_count == 1 else None)
        reader = session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(2)
        reader.close()
    [ready] = wait_ready(world, uri, 1)
    assert ready.delivery_count == 2
    world.broker.restart()
    [ready] = wait_ready(world, uri, 1)
    assert ready.delivery_count == 2
    with world.session() as session:
        inbox = Inbox(lambda m: m.reject(requeue=True))
        session.open_queue(uri, read=True, on_message=inbox)
        [letter] = wait_ready(world, dead, 1)
        assert inbox.counts() == [3]
    assert letter.properties["x-death-reason"] == "delivery-limit"
    assert letter.properties["x-delivery-count"] == "3"
    assert peek(world, uri) == []

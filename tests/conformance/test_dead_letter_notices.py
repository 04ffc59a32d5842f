"""Dead-letter notices (``x-dead-letter-notify``) nobody reads expire, on every store
(the Redis store's rule is its ``ADD`` script's pickup deadline), directly and through
the proxy, on the broker's manual clock. The notice of a dead request goes to its
caller's reply queue; a caller that is gone never reads it, and it stayed there for
good. It carries the dead message's pickup TTL (at least ``NOTICE_MIN_TTL_MS``), or
``NOTICE_DEFAULT_TTL_MS`` when the message had none."""

from __future__ import annotations

import pytest

from holdfast.broker import deadletter
from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import AckStatus
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def gone(world: World, uri: str) -> None:
    """Wait (bounded) until ``uri`` holds no ready message."""
    wait_until(lambda: peek(world, uri) == [], 15, f"{uri} emptied")


def test_a_notice_nobody_reads_expires_after_the_dead_message_s_pickup_ttl(
    world: World,
) -> None:
    uri, dead, reply = world.uri("requests"), world.uri("dead"), world.uri("reply")
    world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    request = {"x-ttl-ms": "20000", "x-dead-letter-notify": reply}
    with world.session() as session:
        assert post_and_wait(session, uri, b"request", properties=request) is AckStatus.SUCCESS
    world.time.advance(21)
    [notice] = wait_ready(world, reply, 1)
    assert notice.properties["x-death-reason"] == "expired"
    assert notice.properties["x-ttl-ms"] == "20000"
    # The dead letter itself does not expire from its dead-letter queue.
    [letter] = wait_ready(world, dead, 1)
    assert "x-ttl-ms" not in letter.properties
    world.time.advance(19)
    wait_ready(world, reply, 1)
    world.time.advance(1.5)
    gone(world, reply)
    assert len(peek(world, dead)) == 1


def test_a_notice_of_a_message_without_a_pickup_ttl_expires_after_the_default(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deadletter, "NOTICE_DEFAULT_TTL_MS", 30_000, raising=False)
    uri, reply = world.uri("rejected"), world.uri("reply")
    with world.session() as session:
        status = post_and_wait(session, uri, b"work", properties={"x-dead-letter-notify": reply})
        assert status is AckStatus.SUCCESS
        inbox = Inbox(lambda message: message.reject(requeue=False))
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(1)
        [notice] = wait_ready(world, reply, 1)
    assert notice.properties["x-death-reason"] == "rejected"
    assert notice.properties["x-ttl-ms"] == "30000"
    world.time.advance(29)
    wait_ready(world, reply, 1)
    world.time.advance(1.5)
    gone(world, reply)


def test_a_short_pickup_ttl_leaves_the_notice_its_minimum(world: World) -> None:
    uri, reply = world.uri("quick"), world.uri("reply")
    request = {"x-ttl-ms": "100", "x-dead-letter-notify": reply}
    with world.session() as session:
        assert post_and_wait(session, uri, b"request", properties=request) is AckStatus.SUCCESS
    world.time.advance(1)
    [notice] = wait_ready(world, reply, 1)
    assert notice.properties["x-ttl-ms"] == str(deadletter.NOTICE_MIN_TTL_MS)

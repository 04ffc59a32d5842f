"""What a consumer learns of a message's acceptance, and paging through a queue, on every
store, directly and through the proxy: a PUSH carries the message's age on the broker's
clock (so ``Message.accepted_at`` is the arrival time minus that age, as the Spark
source's ``timestamp`` column reads it), and ``Peek`` pages with ``skip``."""

from __future__ import annotations

import time

import pytest

from tests.conformance.harness import World
from tests.conformance.support import Inbox, wait_ready

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def test_a_push_carries_the_age_of_the_message_on_the_broker_clock(world: World) -> None:
    uri = world.uri("age")
    with world.session() as session:
        queue = session.open_queue(uri, write=True)
        queue.post(b"old")
        assert session.flush(15)
        wait_ready(world, uri, 1)
        world.time.advance(120.0)  # the broker's clock only: two minutes in the queue
        queue.post(b"new")
        assert session.flush(15)
        inbox = Inbox()
        before = time.time()
        session.open_queue(uri, read=True, on_message=inbox)
        old, new = inbox.wait(2)
        after = time.time()
    assert old.payload == b"old" and new.payload == b"new"
    # Wall time passes too while the test runs: a few seconds of slack, no more.
    assert before - 120.0 - 5.0 <= old.accepted_at <= after - 120.0 + 0.5
    assert before - 5.0 <= new.accepted_at <= after + 0.5


def test_peek_pages_through_the_ready_messages_with_skip(world: World) -> None:
    uri = world.uri("pages")
    with world.session() as session:
        queue = session.open_queue(uri, write=True)
        guids = [queue.post(f"m{i}".encode()) for i in range(25)]
        assert session.flush(15)
    wait_ready(world, uri, 25)
    pages = [world.admin.peek(uri, 10, skip) for skip in (0, 10, 20, 30)]
    assert [len(page) for page in pages] == [10, 10, 5, 0]
    # The pages split the ready messages without overlap or gap. (Their order is the
    # queue's: on Redis, two PUT batches of one session may be stored in either order.)
    seen = [m.guid for page in pages for m in page]
    assert len(set(seen)) == len(seen) and set(seen) == {g.bytes for g in guids}

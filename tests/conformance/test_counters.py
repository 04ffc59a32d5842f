"""A queue's counters (``holdfast stats``), on every store, seen directly (they are the
broker's own): ``accepted`` counts each message stored once, not a replay of it;
``redelivered`` counts each delivery of a message after its first; once everything is
confirmed nothing is ready, held or counted in ``bytes``."""

from __future__ import annotations

import uuid

import pytest

from holdfast.sdk import AckStatus, Message
from tests.conformance.harness import World
from tests.conformance.support import Inbox, post_and_wait
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def test_accepted_counts_stored_messages_and_redelivered_the_deliveries_after_the_first(
    direct_world: World,
) -> None:
    world = direct_world
    uri = world.uri("counted")
    guid = uuid.uuid4()

    def settle(message: Message) -> None:
        # "twice" goes back once (its second delivery is a redelivery), the rest confirm.
        if message.payload == b"twice" and message.delivery_count == 1:
            message.reject(requeue=True)
        else:
            message.confirm()

    with world.session() as session:
        assert post_and_wait(session, uri, b"twice", guid=guid) is AckStatus.SUCCESS
        # A replay of the same PUT: ACKed, not stored again, not counted again.
        assert post_and_wait(session, uri, b"twice", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"once") is AckStatus.SUCCESS
        inbox = Inbox(settle)
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(3)
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "all confirmed")
    assert sorted((m.payload, m.delivery_count) for m in inbox.messages) == [
        (b"once", 1),
        (b"twice", 1),
        (b"twice", 2),
    ]
    stats = world.admin.stats(uri)
    assert (stats.accepted, stats.redelivered) == (2, 1)
    assert (stats.ready, stats.unconfirmed, stats.bytes) == (0, 0, 0)

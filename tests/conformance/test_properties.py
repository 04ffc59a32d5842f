"""A message's properties, on every store, directly and through the proxy, and across a
restart on every durable store: the consumer gets the properties the producer posted,
key for key and value for value, and a message posted without any gets none, also when
messages with and without properties share a frame (the sparse properties column of a
PUT and of a PUSH batch) and on redelivery."""

from __future__ import annotations

import pytest

from holdfast.sdk import AckStatus, QueueOptions
from tests.conformance.harness import World
from tests.conformance.support import Inbox, wait_ready

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60)]

POSTED: list[dict[str, str] | None] = [
    {"tenant": "acme", "trace": "ü-ñ-€", "empty": ""},
    None,
    {"k": "v"},
    None,
    {"order": "17", "x-app-flag": "1"},
    {"tenant": "globex", "trace": "t-2", "empty": "not"},
    {"order": "18", "x-app-flag": ""},
    {"x-app-flag": "0", "order": "19"},
]
"""Messages posted in one go (one PUT frame): with and without properties, some with
the same keys (a property group of several messages on the wire), one with those keys
in another order."""


def post_all(world: World, uri: str) -> None:
    with world.session() as producer:
        queue = producer.open_queue(uri, write=True)
        statuses: list[AckStatus] = []
        for n, properties in enumerate(POSTED):
            queue.post(b"%d" % n, properties=properties, on_ack=lambda a: statuses.append(a.status))
        assert producer.flush(timeout=15)
    assert statuses == [AckStatus.SUCCESS] * len(POSTED)


def as_posted(properties: dict[str, str] | None) -> dict[str, str]:
    return dict(properties or {})


def test_a_message_is_delivered_with_the_properties_it_was_posted_with(world: World) -> None:
    uri = world.uri("props")
    post_all(world, uri)
    with world.session() as consumer:
        inbox = Inbox(lambda m: m.confirm())
        consumer.open_queue(uri, read=True, on_message=inbox)
        delivered = inbox.wait(len(POSTED))
    assert [m.payload for m in delivered] == [b"%d" % n for n in range(len(POSTED))]
    assert [dict(m.properties) for m in delivered] == [as_posted(p) for p in POSTED]


def test_a_redelivered_message_keeps_its_properties(world: World) -> None:
    uri = world.uri("props-again")
    post_all(world, uri)
    with world.session() as first:
        held = Inbox()  # never settled: redelivered when this session closes
        first.open_queue(uri, read=True, on_message=held)
        held.wait(len(POSTED))
    with world.session() as second:
        inbox = Inbox(lambda m: m.confirm())
        second.open_queue(
            uri, read=True, on_message=inbox, options=QueueOptions(max_unconfirmed_messages=100)
        )
        again = inbox.wait(len(POSTED))
    assert [m.delivery_count for m in again] == [2] * len(POSTED)
    assert [dict(m.properties) for m in again] == [as_posted(p) for p in POSTED]


def test_properties_survive_a_broker_restart(durable_world: World) -> None:
    """On every store that keeps messages across a restart, what it reads back carries
    the properties as posted (the store's own encoding: sqlite's JSON column, Redis's
    message metadata), and none for a message posted without any."""
    world = durable_world
    uri = world.uri("props-restart")
    post_all(world, uri)
    wait_ready(world, uri, len(POSTED))
    world.broker.restart()
    with world.session() as consumer:
        inbox = Inbox(lambda m: m.confirm())
        consumer.open_queue(
            uri, read=True, on_message=inbox, options=QueueOptions(max_unconfirmed_messages=100)
        )
        delivered = inbox.wait(len(POSTED))
    assert [m.payload for m in delivered] == [b"%d" % n for n in range(len(POSTED))]
    assert [dict(m.properties) for m in delivered] == [as_posted(p) for p in POSTED]

"""Delivery limits, TTL, reject and dead-letter queues, on the memory, sqlite and Redis
stores (issues #14, #13): each rule ends where the policy says, with the reason on the
message."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Message, Session, aio
from holdfast.sdk.admin import AdminClient
from tests.policies.support import FAST, QUICK_RETRY, Collector, always_raises, post_all, ready
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

URI = "hf://shop/orders"
DLQ = "hf://shop/orders.dlq"


def test_a_handler_that_always_raises_ends_in_the_dead_letter_queue_after_n_deliveries(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(max_deliveries=3, dead_letter=DLQ))
    seen: list[Message] = []
    dead = Collector()
    with Session(broker.address, options=FAST) as session:
        (guid,) = post_all(session, URI, [b"poison"])
        session.open_queue(
            URI,
            read=True,
            on_message=always_raises(seen),
            options=QUICK_RETRY,
        )
        session.open_queue(DLQ, read=True, on_message=dead)
        (letter,) = dead.wait_for(1)
    assert [m.delivery_count for m in seen] == [1, 2, 3]
    assert letter.guid == guid and letter.payload == b"poison"
    assert letter.properties["x-death-reason"] == "delivery-limit"
    assert letter.properties["x-original-uri"] == URI
    assert letter.properties["x-delivery-count"] == "3"
    stats = admin.stats(URI)
    assert (stats.ready, stats.unconfirmed, stats.rejected, stats.dead_lettered) == (0, 0, 3, 1)


def test_an_asyncio_handler_that_always_raises_is_rejected_like_a_threaded_one(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(max_deliveries=3, dead_letter=DLQ))
    seen: list[Message] = []

    async def run() -> Message:
        async with aio.Session(broker.address, options=FAST) as session:
            queue = await session.open_queue(URI, write=True)
            await queue.post(b"poison")
            await session.open_queue(
                URI, read=True, on_message=always_raises(seen), options=QUICK_RETRY
            )
            dead = await session.open_queue(DLQ, read=True)
            return await asyncio.wait_for(anext(aiter(dead)), 30)

    letter = asyncio.run(run())
    assert [m.delivery_count for m in seen] == [1, 2, 3]
    assert letter.payload == b"poison"
    assert letter.properties["x-death-reason"] == "delivery-limit"


def test_a_ready_message_past_its_ttl_is_dead_lettered_as_expired(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(ttl=0.3, dead_letter=DLQ))
    dead = Collector()
    with Session(broker.address, options=FAST) as session:
        guids = post_all(session, URI, [b"a", b"b"])
        session.open_queue(DLQ, read=True, on_message=dead)
        letters = dead.wait_for(2)
    assert [m.guid for m in letters] == guids
    assert {m.properties["x-death-reason"] for m in letters} == {"expired"}
    assert admin.stats(URI).expired == 2
    assert admin.stats(URI).ready == 0


def test_reject_with_requeue_redelivers_and_without_dead_letters(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(dead_letter=DLQ))
    got = Collector(confirm=False)
    dead = Collector()
    with Session(broker.address, options=FAST) as session:
        (guid,) = post_all(session, URI, [b"m"])
        session.open_queue(URI, read=True, on_message=got)
        first = got.wait_for(1)[0]
        first.reject(requeue=True)
        second = got.wait_for(2)[1]
        assert (second.guid, second.delivery_count) == (guid, 2)
        second.reject(requeue=False)
        session.open_queue(DLQ, read=True, on_message=dead)
        (letter,) = dead.wait_for(1)
    assert letter.guid == guid
    assert letter.properties["x-death-reason"] == "rejected"
    assert letter.properties["x-delivery-count"] == "2"
    assert len(got.messages) == 2


def test_reject_with_a_delay_holds_the_message_back(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    got = Collector(confirm=False)
    with Session(broker.address, options=FAST) as session:
        post_all(session, URI, [b"m"])
        session.open_queue(URI, read=True, on_message=got)
        got.wait_for(1)[0].reject(requeue=True, delay=1.0)
        wait_until(lambda: admin.stats(URI).ready == 1, 5, "the delayed message counted ready")
        assert len(got.messages) == 1  # not before its delay
        second = got.wait_for(2)[1]
        second.confirm()
        wait_until(lambda: admin.stats(URI).unconfirmed == 0, 5, "the confirm")
    assert second.delivery_count == 2


def test_without_a_dead_letter_queue_dead_messages_are_dropped_and_counted(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    got = Collector(confirm=False)
    with Session(broker.address, options=FAST) as session:
        post_all(session, URI, [b"m"])
        session.open_queue(URI, read=True, on_message=got)
        got.wait_for(1)[0].reject(requeue=False)
        wait_until(lambda: admin.stats(URI).dead_lettered == 1, 5, "the drop counted")
    stats = admin.stats(URI)
    assert (stats.ready, stats.unconfirmed, stats.bytes) == (0, 0, 0)
    assert [q.uri for q in admin.queues()] == [URI]


def test_dead_letter_replay_moves_each_message_back_once(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(dead_letter=DLQ))
    got = Collector(confirm=False)
    with Session(broker.address, options=FAST) as session:
        guids = post_all(session, URI, [b"a", b"b", b"c"])
        handle = session.open_queue(URI, read=True, on_message=got)
        for message in got.wait_for(3):
            message.reject(requeue=False)
        wait_until(lambda: ready(admin, DLQ) == 3, 10, "three dead letters")
        handle.close()
        assert admin.replay_dead_letters(DLQ) == (3, "")
        assert admin.replay_dead_letters(DLQ) == (0, "")
        assert admin.stats(DLQ).ready == 0
        back = Collector()
        session.open_queue(URI, read=True, on_message=back)
        messages = back.wait_for(3)
    assert sorted(m.guid for m in messages) == sorted(guids)
    assert all("x-death-reason" not in m.properties for m in messages)
    assert [m.delivery_count for m in messages] == [1, 1, 1]

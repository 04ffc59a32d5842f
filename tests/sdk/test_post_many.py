"""``post_many``: a batch of PUTs of one queue is each of them posted, in order, under
its own uuid7, reported once each, kept through a reconnect (rules 1-3); and it is
all or none: a refusal takes none of the batch. Scripted against ``SessionEngine``,
then once on each front-end against a real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from holdfast.sdk import Session, aio
from holdfast.sdk.engine import PUT_OVERHEAD
from holdfast.sdk.errors import (
    BufferFullError,
    InvalidArgumentError,
    InvalidPropertiesError,
    NotWritableError,
    PayloadTooLargeError,
)
from holdfast.sdk.types import Ack, AckStatus
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder
from tests.support.sessions import FAST, drain_messages, unique_uri
from tests.support.waiting import wait_until, wait_until_async

from .fakes import Harness, put_guids, puts_in, reader, reconnect, writer


def post_many(
    h: Harness,
    queue_id: int,
    payloads: list[Any],  # not only bytes: what a caller may pass is checked
    properties: dict[str, str] | None = None,
    on_ack: Callable[[Ack], object] | None = None,
) -> list[uuid.UUID]:
    guids = h.engine.post_many(queue_id, payloads, properties, on_ack, h.now)
    h.run_callbacks()
    return guids


def test_each_payload_is_a_put_in_order_under_its_own_increasing_uuid7() -> None:
    h = Harness()
    queue_id = writer(h)
    before = h.post(queue_id, b"single")
    guids = post_many(h, queue_id, [b"a", bytearray(b"b"), memoryview(b"c")])
    after = h.post(queue_id, b"single again")
    assert [g.version for g in guids] == [7, 7, 7]
    assert [before, *guids, after] == sorted([before, *guids, after])
    puts = puts_in(h.sent_frames())
    assert [(p.guid, p.payload) for p in puts[1:4]] == [
        (guid.bytes, payload) for guid, payload in zip(guids, (b"a", b"b", b"c"), strict=True)
    ]
    assert h.engine.pending_count == 5


def test_each_put_is_reported_once_to_the_batchs_on_ack_with_its_properties() -> None:
    h = Harness()
    queue_id = writer(h)
    mine: list[uuid.UUID] = []
    guids = post_many(
        h, queue_id, [b"1", b"2"], properties={"k": "v"}, on_ack=lambda ack: mine.append(ack.guid)
    )
    assert [dict(p.properties) for p in puts_in(h.sent_frames())] == [{"k": "v"}, {"k": "v"}]
    h.ack(*guids)
    h.ack(*guids)  # a stale repeat reports nothing
    assert mine == guids
    assert h.acks == []  # the batch's own on_ack, not the queue's
    assert h.engine.pending_count == 0


def test_a_batch_posted_while_disconnected_is_sent_after_the_reconnect_in_order() -> None:
    h = Harness()
    queue_id = writer(h)
    h.lose()
    guids = post_many(h, queue_id, [b"x", b"y", b"z"])
    assert put_guids(reconnect(h)) == guids
    h.ack(*guids)
    assert [h.statuses(g) for g in guids] == [[AckStatus.SUCCESS]] * 3


@pytest.mark.parametrize(
    ("payloads", "properties", "error"),
    [
        ([b"ok", "not bytes"], None, InvalidArgumentError),
        ([b"ok", b"x" * (4 * 1024 * 1024 + 1)], None, PayloadTooLargeError),
        ([b"ok"], {"count": 3}, InvalidPropertiesError),
    ],
)
def test_a_refused_payload_or_property_takes_none_of_the_batch(
    payloads: list[object], properties: dict[str, str] | None, error: type[Exception]
) -> None:
    h = Harness()
    queue_id = writer(h)
    sent = len(h.sent_frames())
    with pytest.raises(error):
        post_many(h, queue_id, payloads, properties=properties)
    assert h.engine.pending_count == 0
    assert len(h.sent_frames()) == sent


def test_a_batch_past_the_disconnected_bound_takes_none_of_it() -> None:
    h = Harness(max_disconnected_buffer_bytes=1000)
    queue_id = writer(h)
    h.lose()
    post_many(h, queue_id, [b"x" * (300 - PUT_OVERHEAD)] * 2)
    with pytest.raises(BufferFullError):
        post_many(h, queue_id, [b"x" * (300 - PUT_OVERHEAD)] * 2)  # 1200 > 1000
    assert h.engine.pending_count == 2
    post_many(h, queue_id, [b"x" * (300 - PUT_OVERHEAD)])  # 900: still fits
    assert h.engine.pending_count == 3


def test_a_queue_not_open_for_writing_refuses_the_batch() -> None:
    h = Harness()
    queue_id = reader(h)
    with pytest.raises(NotWritableError):
        post_many(h, queue_id, [b"x"])


def test_an_empty_batch_is_nothing() -> None:
    h = Harness()
    queue_id = writer(h)
    assert post_many(h, queue_id, []) == []
    assert h.engine.pending_count == 0


@pytest.mark.timeout(60)
def test_threaded_and_asyncio_post_many_through_a_broker(broker: BrokerProcess) -> None:
    uri = unique_uri("post-many")
    payloads = [f"m{i}".encode() for i in range(2500)]  # frames of up to 1,000 PUTs
    acks = AckRecorder()
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        guids = queue.post_many(payloads)
        wait_until(lambda: len(acks.acks) == len(payloads), 30, "every ACK")
    assert acks.per_guid() == {guid: 1 for guid in guids}
    assert {ack.status for ack, _ in acks.acks} == {AckStatus.SUCCESS}

    async def asyncio_batch() -> list[uuid.UUID]:
        acked: list[uuid.UUID] = []
        async with aio.Session(broker.address, options=FAST) as session:
            queue = await session.open_queue(uri, write=True)
            posted = await queue.post_many(payloads, {"k": "v"}, lambda ack: acked.append(ack.guid))
            await wait_until_async(lambda: len(acked) == len(payloads), 30, "every ACK")
        assert sorted(acked) == sorted(posted)
        return posted

    second = asyncio.run(asyncio_batch())
    received = drain_messages(broker.address, uri, 2 * len(payloads))
    assert [m.payload for m in received] == payloads * 2  # one queue: post order
    assert [m.guid for m in received] == guids + second
    assert [dict(m.properties) for m in received[len(payloads) :]] == [{"k": "v"}] * 2500

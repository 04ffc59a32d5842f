"""``Session.stats()``: the client counters, on the sync and the asyncio SDK, against the
in-process test broker (``holdfast.sdk.testing``) and the scripted engine harness."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch
from holdfast.sdk import AckStatus, Message, QueueOptions, Session, SessionStats, aio
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from tests.support.columns import PushView, push_batch_of
from tests.support.waiting import wait_until

from .fakes import Harness

URI = "hf://test/stats"
FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


def test_a_new_session_counts_nothing_and_its_stats_are_frozen() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        stats = s.stats()
    assert stats == SessionStats(0, 0, {}, 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.reconnects = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.acks[AckStatus.SUCCESS] = 1  # type: ignore[index]


def test_acks_are_counted_by_status_and_the_buffer_empties() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True)
        for i in range(20):
            queue.post(b"ok-%d" % i)
        broker.fail_next_puts(2, AckStatus.STORE_ERROR)
        queue.post(b"refused-1")
        queue.post(b"refused-2")
        queue.post(b"x" * 10, properties={"k": "v"})
        assert s.flush(timeout=10)
        stats = s.stats()
    # 20 before the failures, then 2 refused, then 1 more: 21 successes.
    assert dict(stats.acks) == {AckStatus.SUCCESS: 21, AckStatus.STORE_ERROR: 2}
    assert stats.acks_total == 23
    assert (stats.buffered_puts, stats.buffered_bytes) == (0, 0)


def test_buffered_puts_and_bytes_reconnects_and_retransmits() -> None:
    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport(), options=FAST) as s,
    ):
        queue = s.open_queue(URI, write=True)
        broker.delay(5.0)  # ACKs are held: the PUTs stay buffered
        for i in range(5):
            queue.post(b"%05d" % i)
        held = s.stats()
        assert held.buffered_puts == 5
        assert held.buffered_bytes > 5 * 5  # payload plus per-PUT overhead
        broker.delay(0)
        assert broker.drop_connections() == 1  # the held ACKs never arrive
        assert s.flush(timeout=10)
        stats = s.stats()
        assert broker.depth(URI) == 5  # the replays were recognised by GUID
    assert stats.reconnects == 1
    assert stats.retransmitted_puts == 5
    assert dict(stats.acks) == {AckStatus.SUCCESS: 5}


def test_posts_that_waited_on_the_high_watermark_are_counted() -> None:
    # A 1-byte high watermark: a post finds its predecessor still unsent and waits.
    options = dataclasses.replace(FAST, high_watermark_bytes=1)
    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport(), options=options) as s,
    ):
        queue = s.open_queue(URI, write=True)
        for i in range(200):
            queue.post(b"%05d" % i)
        assert s.flush(timeout=10)
        stats = s.stats()
    assert stats.high_watermark_waits >= 1
    assert stats.broker_busy_waits == 0
    assert stats.acks[AckStatus.SUCCESS] == 200


def test_a_wait_on_the_brokers_push_back_is_counted_apart() -> None:
    h = Harness()
    h.connect()
    h.answer_hello()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    h.sent_frames()
    h.feed(pb.ServerFrame(acks=ack_batch([(queue_id, guid.bytes, pb.STATUS_HISTORY_FULL)])))
    assert h.engine.admit_post(h.now, h.now, queue_id) > 0
    h.engine.note_admission_wait(queue_id)
    stats = h.engine.stats()
    assert (stats.broker_busy_waits, stats.high_watermark_waits) == (1, 0)
    assert stats.acks == {}  # a push-back is no outcome


def test_deliveries_confirms_and_rejects_are_counted() -> None:
    got: list[Message] = []
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        producer = s.open_queue(URI, write=True)
        for i in range(6):
            producer.post(b"%d" % i)
        assert s.flush(timeout=10)

        def consume(message: Message) -> None:
            got.append(message)
            if message.payload in (b"0", b"1", b"2"):
                message.confirm()
            elif message.payload == b"3":
                message.reject(requeue=False)
            elif message.delivery_count == 1:
                raise RuntimeError("fails once: rejected with requeue, delivered again")
            else:
                message.confirm()

        options = QueueOptions(retry_delay=0.01)
        s.open_queue(URI, read=True, on_message=consume, options=options)
        wait_until(lambda: broker.depth(URI) == 0, 10, "the queue to empty")
        wait_until(lambda: s.stats().messages_confirmed == 5, 10, "five CONFIRMs")
        stats = s.stats()
    assert stats.messages_delivered == len(got) == 8  # 4 and 5 twice
    assert stats.messages_confirmed == 5
    assert stats.messages_rejected == 3  # 3 for good, 4 and 5 once with requeue


def test_a_dropped_confirm_is_not_counted() -> None:
    h = Harness()
    h.connect()
    h.answer_hello()
    queue_id = h.open_active(read=True)
    h.feed(pb.ServerFrame(pushes=push_batch_of([PushView(queue_id, b"g" * 16, b"p")])))
    [message] = h.messages
    h.lose()
    with pytest.raises(Exception, match="dropped"):
        message.confirm()
    stats = h.engine.stats()
    assert (stats.messages_delivered, stats.messages_confirmed) == (1, 0)


def test_the_asyncio_session_has_the_same_counters() -> None:
    async def main() -> SessionStats:
        with Broker() as broker:
            async with aio.Session(broker.address, transport=broker.async_transport()) as s:
                queue = await s.open_queue(URI, write=True, read=True)
                for i in range(3):
                    await queue.post(b"%d" % i)
                assert await s.flush(timeout=10)
                seen = 0
                async for message in queue:
                    message.confirm()
                    seen += 1
                    if seen == 3:
                        break
                return s.stats()

    stats = asyncio.run(main())
    assert dict(stats.acks) == {AckStatus.SUCCESS: 3}
    assert (stats.messages_delivered, stats.messages_confirmed) == (3, 3)
    assert stats.buffered_puts == 0

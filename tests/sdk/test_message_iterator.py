"""``for message in queue.messages(timeout=...)``: the synchronous iterator, against the
in-process test broker (``holdfast.sdk.testing``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from holdfast.sdk import (
    InvalidArgumentError,
    Message,
    QueueNotOpenError,
    QueueOptions,
    QueueStateError,
    Session,
    aio,
)
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from tests.support.waiting import wait_until

URI = "hf://test/iterator"
FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


def post(session: Session, count: int, uri: str = URI) -> None:
    queue = session.open_queue(uri, write=True)
    for i in range(count):
        queue.post(b"%03d" % i)
    assert session.flush(timeout=10)


def test_iterates_in_order_then_ends_after_the_timeout() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        post(s, 50)
        queue = s.open_queue(URI, read=True)
        got = []
        started = time.monotonic()
        for message in queue.messages(timeout=0.5):
            got.append(message.payload)
            message.confirm()
        waited = time.monotonic() - started
        wait_until(lambda: broker.depth(URI) == 0, 10, "every CONFIRM")
    assert got == [b"%03d" % i for i in range(50)]
    assert waited >= 0.5  # the last wait for a next message ran out


def test_a_timeout_of_zero_takes_only_what_has_arrived() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, read=True, write=True)
        assert list(queue.messages(timeout=0)) == []
        queue.post(b"one")
        wait_until(lambda: s.stats().messages_delivered == 1, 10, "the delivery")
        [message] = list(queue.messages(timeout=0))
        message.confirm()
        assert message.payload == b"one"


def test_closing_the_queue_ends_an_iteration_that_waits_for_ever() -> None:
    ended = threading.Event()
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, read=True)

        def consume() -> None:
            for _ in queue.messages(timeout=None):
                pass
            ended.set()

        thread = threading.Thread(target=consume)
        thread.start()
        assert not ended.wait(0.1)  # it waits for a message: only the close can end it
        queue.close()
        thread.join(10)
        assert ended.is_set()
        with pytest.raises(QueueNotOpenError):
            queue.messages()


def test_closing_the_session_ends_the_iteration() -> None:
    ended = threading.Event()
    with Broker() as broker:
        s = Session(broker.address, transport=broker.transport())
        queue = s.open_queue(URI, read=True)

        def consume() -> None:
            for _ in queue.messages():
                pass
            ended.set()

        thread = threading.Thread(target=consume)
        thread.start()
        s.close()
        thread.join(10)
    assert ended.is_set()


def test_a_queue_with_on_message_or_without_read_refuses_messages() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        with_handler = s.open_queue(URI, read=True, on_message=lambda m: m.confirm())
        with pytest.raises(QueueStateError, match="with on_message"):
            with_handler.messages()
        writer = s.open_queue(URI, write=True)
        with pytest.raises(QueueStateError, match="without read=True"):
            writer.messages(timeout=1)
        reader = s.open_queue("hf://test/other", read=True)
        with pytest.raises(InvalidArgumentError):
            reader.messages(timeout=-1)


def test_unsettled_messages_hold_the_iterator_to_the_flow_limit() -> None:
    """Bounded memory: with max_unconfirmed_messages=5 no more than 5 are held, and the
    next one comes once one is settled."""
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        post(s, 20)
        queue = s.open_queue(URI, read=True, options=QueueOptions(max_unconfirmed_messages=5))
        held = list(queue.messages(timeout=0.5))
        assert len(held) == 5
        assert broker.unconfirmed(URI) == 5
        held[0].confirm()
        more = list(queue.messages(timeout=0.5))
        assert len(more) == 1
        for message in [*held[1:], *more]:
            message.reject(requeue=False)
        rest = list(queue.messages(timeout=0.5))
        assert len(rest) == 5


def test_deliveries_of_a_dropped_connection_are_discarded_and_come_again() -> None:
    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport(), options=FAST) as s,
    ):
        post(s, 10)
        queue = s.open_queue(URI, read=True)
        wait_until(lambda: s.stats().messages_delivered == 10, 10, "ten deliveries")
        broker.drop_connections()  # the 10 in the inbox are stale now
        wait_until(lambda: s.stats().reconnects == 1, 10, "the session to reconnect")
        got: Counter[bytes] = Counter()
        counts = []
        for message in queue.messages(timeout=1.0):
            got[message.payload] += 1
            counts.append(message.delivery_count)
            message.confirm()
        wait_until(lambda: broker.depth(URI) == 0, 10, "the queue to empty")
    assert got == Counter({b"%03d" % i: 1 for i in range(10)})  # each once, none stale
    assert set(counts) == {2}


def test_several_threads_share_the_messages_each_once() -> None:
    seen: list[Message] = []
    lock = threading.Lock()
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        post(s, 200)
        queue = s.open_queue(URI, read=True)

        def consume() -> None:
            for message in queue.messages(timeout=0.5):
                with lock:
                    seen.append(message)
                message.confirm()

        threads = [threading.Thread(target=consume) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        wait_until(lambda: broker.depth(URI) == 0, 10, "every CONFIRM")
    assert Counter(m.payload for m in seen) == Counter({b"%03d" % i: 1 for i in range(200)})


def test_async_iteration_discards_the_deliveries_of_a_lost_connection_too() -> None:
    async def main() -> Counter[bytes]:
        got: Counter[bytes] = Counter()
        with Broker() as broker:
            async with aio.Session(
                broker.address, transport=broker.async_transport(), options=FAST
            ) as s:
                queue = await s.open_queue(URI, write=True, read=True)
                for i in range(10):
                    await queue.post(b"%03d" % i)
                while s.stats().messages_delivered < 10:
                    await asyncio.sleep(0.01)  # polled within the test's timeout
                broker.drop_connections()  # the 10 waiting in the inbox are stale now
                while s.stats().reconnects < 1:
                    await asyncio.sleep(0.01)
                while sum(got.values()) < 10:
                    message = await asyncio.wait_for(anext(queue), 10)
                    got[message.payload] += 1
                    assert message.delivery_count == 2
                    message.confirm()  # would raise ConfirmDroppedError if stale
        return got

    assert asyncio.run(main()) == Counter({b"%03d" % i: 1 for i in range(10)})

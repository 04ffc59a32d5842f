"""The SDK against a real broker process, through real gRPC on 127.0.0.1.

Faults here are process-level: SIGKILL + restart of the broker, and SIGSTOP /
SIGCONT, which freezes the broker with its sockets open: a black hole that only
gRPC keepalive can detect, and a peer that stops reading (the high watermark).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from holdfast.sdk import (
    AckStatus,
    BandwidthLimitError,
    ConfirmDroppedError,
    ConnectionLost,
    HoldfastError,
    InvalidQueueUriError,
    Message,
    PayloadTooLargeError,
    QueueOptions,
    QueueReopened,
    Reconnected,
    Session,
    SessionEvent,
    SessionOptions,
    StateRestored,
)
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST, drain, unique_uri
from tests.support.waiting import wait_until


def ack_events(acks: AckRecorder, events: EventRecorder) -> Callable[[SessionEvent], None]:
    """An on_event handler that records events and tags later ACKs with the reconnect epoch.

    Events and ACK callbacks run on the same dispatcher thread in order, so an
    ACK recorded after a Reconnected event came from the new connection.
    """

    def handler(event: SessionEvent) -> None:
        events(event)
        if isinstance(event, Reconnected):
            with acks.lock:
                acks.epoch += 1

    return handler


@contextmanager
def frozen(broker: BrokerProcess) -> Iterator[None]:
    """SIGSTOP the broker for the duration of the block; SIGCONT it after."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


def test_post_returns_uuid7_and_every_put_is_acked_once(broker: BrokerProcess) -> None:
    acks = AckRecorder()
    uri = unique_uri("basic")
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        guids = [queue.post(f"m{i}".encode(), on_ack=acks) for i in range(2000)]
        assert session.flush(timeout=30)
    assert all(g.version == 7 for g in guids)
    assert len(set(guids)) == 2000
    assert acks.per_guid() == Counter({g: 1 for g in guids})
    assert acks.with_status(AckStatus.SUCCESS) == set(guids)
    assert drain(broker.address, uri, 2000) == Counter({g: 1 for g in guids})


def test_consumer_receives_properties_and_delivery_count(broker: BrokerProcess) -> None:
    uri = unique_uri("props")
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        guid = queue.post(b"hello", properties={"kind": "greeting"})
        assert session.flush(timeout=10)
        received = MessageRecorder()
        session.open_queue(uri, read=True, on_message=received)
        wait_until(lambda: len(received) == 1, 10, "the message")
    message = received.messages[0]
    assert (message.guid, message.payload, dict(message.properties)) == (
        guid,
        b"hello",
        {"kind": "greeting"},
    )
    assert message.delivery_count == 1
    assert message.queue_uri == uri


def test_bad_input_is_refused_with_typed_errors_and_nothing_is_buffered(
    broker: BrokerProcess,
) -> None:
    with Session(broker.address, options=FAST) as session:
        with pytest.raises(InvalidQueueUriError):
            session.open_queue("http://nope/queue", write=True)
        queue = session.open_queue(unique_uri("bad"), write=True)
        with pytest.raises(PayloadTooLargeError):
            queue.post(b"x" * (4 * 1024 * 1024 + 1))
        assert session.pending_count == 0


def test_failover_skips_a_dead_address(broker: BrokerProcess, free_port: int) -> None:
    events = EventRecorder()
    addresses = f"127.0.0.1:{free_port},{broker.address}"
    with Session(addresses, on_event=events, options=FAST) as session:
        queue = session.open_queue(unique_uri("failover"), write=True, timeout=20)
        queue.post(b"x")
        assert session.flush(timeout=10)
    assert events.names()[0] == "ConnectAttemptFailed"
    assert "Connected" in events.names()


@pytest.mark.timeout(300)
def test_100k_puts_through_a_broker_kill_and_restart(broker: BrokerProcess) -> None:
    """Memory store: what the first broker ACKed dies with it (expected), but every PUT
    gets exactly one ACK, and the restarted broker holds every PUT it ACKed exactly once."""
    total = 100_000
    acks, events = AckRecorder(), EventRecorder()
    uri = unique_uri("restart")
    posted: list[uuid.UUID] = []
    with Session(broker.address, on_event=ack_events(acks, events), options=FAST) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        for i in range(total):
            posted.append(queue.post(b"%06d" % i))
            if i == total // 3:
                broker.kill()
            elif i == total // 2:
                broker.restart()
        assert session.flush(timeout=120)
    assert len(posted) == total
    assert acks.per_guid() == Counter({g: 1 for g in posted})
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    assert [type(e).__name__ for e in events.of(ConnectionLost)] == ["ConnectionLost"]
    acked_by_new_broker = {ack.guid for ack, epoch in acks.acks if epoch >= 1}
    assert len(acked_by_new_broker) >= total - total // 3 - 1
    in_queue = drain(broker.address, uri, len(acked_by_new_broker))
    assert set(in_queue) >= acked_by_new_broker
    assert set(in_queue) <= set(posted)
    assert max(in_queue.values()) == 1


@pytest.mark.timeout(120)
def test_producer_and_consumer_through_a_black_hole(broker: BrokerProcess) -> None:
    """A frozen broker keeps its sockets open: only keepalive notices. After it thaws,
    the producer retransmits, the broker's dedup absorbs the replays, and the consumer's
    unconfirmed messages are redelivered: the queue held every message exactly once."""
    total = 20_000
    uri = unique_uri("blackhole")
    acks, producer_events = AckRecorder(), EventRecorder()
    consumer_events = EventRecorder()
    received = MessageRecorder()
    with (
        Session(broker.address, on_event=consumer_events, options=FAST) as consumer,
        Session(
            broker.address, on_event=ack_events(acks, producer_events), options=FAST
        ) as producer,
    ):
        consumer.open_queue(uri, read=True, on_message=received)
        queue = producer.open_queue(uri, write=True, on_ack=acks)
        posted = [queue.post(b"%06d" % i) for i in range(total // 2)]
        with frozen(broker):
            wait_until(
                lambda: producer_events.of(ConnectionLost) and consumer_events.of(ConnectionLost),
                15,
                "both sessions to notice the black hole",
            )
            posted += [queue.post(b"%06d" % i) for i in range(total // 2, total)]
        assert producer.flush(timeout=60)
        wait_until(lambda: set(received.guids()) >= set(posted), 60, "every message consumed")

    assert acks.per_guid() == Counter({g: 1 for g in posted})
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    # At-least-once delivery may repeat a message, but only as a redelivery: two first
    # deliveries of one GUID would mean the queue held it twice.
    first_deliveries = Counter(m.guid for m in received.messages if m.delivery_count == 1)
    assert max(first_deliveries.values()) == 1
    assert set(received.guids()) == set(posted)
    names = producer_events.names()
    lost = names.index("ConnectionLost")
    assert names[lost : lost + 4] == [
        "ConnectionLost",
        "Reconnected",
        "QueueReopened",
        "StateRestored",
    ]
    restored = producer_events.of(StateRestored)[0]
    assert isinstance(restored, StateRestored) and restored.expired == 0
    assert all(isinstance(e, QueueReopened) and e.ok for e in producer_events.of(QueueReopened))


@pytest.mark.timeout(120)
def test_confirm_while_disconnected_is_dropped_and_the_message_redelivered(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("confirm")
    events = EventRecorder()
    held = MessageRecorder(confirm=False)
    with Session(broker.address, options=FAST) as producer:
        producer.open_queue(uri, write=True).post(b"only")
        assert producer.flush(timeout=10)
    with Session(broker.address, on_event=events, options=FAST) as consumer:
        consumer.open_queue(uri, read=True, on_message=held)
        wait_until(lambda: len(held) == 1, 10, "first delivery")
        first: Message = held.messages[0]
        with frozen(broker):
            wait_until(lambda: events.of(ConnectionLost), 15, "the session to notice")
            with pytest.raises(ConfirmDroppedError):
                first.confirm()
        wait_until(lambda: len(held) == 2, 30, "the redelivery")
        again = held.messages[1]
        assert again.guid == first.guid
        assert again.delivery_count == 2
        with pytest.raises(ConfirmDroppedError):
            first.confirm()  # stale: delivered on the old connection
        again.confirm()


@pytest.mark.timeout(120)
def test_high_watermark_holds_post_for_5_seconds_then_refuses(broker: BrokerProcess) -> None:
    """A broker that stops reading makes gRPC stop taking frames; post() then waits in
    the caller's thread for 5 s and raises BandwidthLimitError without taking the message."""
    options = SessionOptions(
        keepalive_time=60, keepalive_timeout=60, high_watermark_bytes=1024 * 1024
    )
    uri = unique_uri("hwm")
    acks = AckRecorder()
    payload = b"x" * 100_000
    taken: list[uuid.UUID] = []
    with Session(broker.address, options=options) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        with frozen(broker):
            started = time.monotonic()
            with pytest.raises(BandwidthLimitError):
                while time.monotonic() - started < 60:
                    taken.append(queue.post(payload))
            refused_at = time.monotonic()
            pending_before = session.pending_count
        assert session.flush(timeout=60)
    # The last, refused post waited for the whole 5 s window in this thread.
    assert refused_at - started >= 5.0
    assert pending_before == len(taken)
    assert acks.per_guid() == Counter({g: 1 for g in taken})
    assert drain(broker.address, uri, len(taken)) == Counter({g: 1 for g in taken})


def test_posts_from_many_threads_keep_per_thread_order(broker: BrokerProcess) -> None:
    threads, per_thread = 8, 2500
    uri = unique_uri("threads")
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        barrier = threading.Barrier(threads)

        def produce(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                queue.post(f"{t}:{i}".encode())

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert session.flush(timeout=60)
        received = MessageRecorder()
        session.open_queue(
            uri,
            read=True,
            on_message=received,
            options=QueueOptions(max_unconfirmed_messages=threads * per_thread),
        )
        wait_until(lambda: len(received) == threads * per_thread, 60, "all messages")
    order: dict[int, list[int]] = {t: [] for t in range(threads)}
    for message in received.messages:
        t, i = message.payload.decode().split(":")
        order[int(t)].append(int(i))
    assert all(seq == list(range(per_thread)) for seq in order.values())


def test_confirms_issued_just_before_close_reach_the_broker(broker: BrokerProcess) -> None:
    """close() ends the stream gracefully: the broker reads every CONFIRM sent before it,
    so the queue then holds exactly the messages whose confirm() did not succeed."""
    uri = unique_uri("close-confirms")
    # Enough that close() lands while confirms are still flowing: a fast host consumed
    # 3,000 in the 10 ms between two polls of the thousandth confirm and left none.
    total = 20_000
    with Session(broker.address, options=FAST) as producer:
        queue = producer.open_queue(uri, write=True)
        posted = {queue.post(b"%05d" % i) for i in range(total)}
        assert producer.flush(timeout=30)
    confirmed: set[uuid.UUID] = set()
    thousand = threading.Event()

    def confirm(message: Message) -> None:
        try:
            message.confirm()
        except HoldfastError:
            return  # the session is closing: this one stays in the queue
        confirmed.add(message.guid)
        if len(confirmed) >= 1000:
            thousand.set()

    with Session(broker.address, options=FAST) as consumer:
        consumer.open_queue(
            uri, read=True, on_message=confirm, options=QueueOptions(max_unconfirmed_messages=500)
        )
        assert thousand.wait(30), "a thousand confirms"
        # close() right away: the last CONFIRMs are still on their way out.
    remaining = posted - confirmed
    assert 0 < len(remaining) < len(posted)
    assert drain(broker.address, uri, len(remaining)) == Counter({g: 1 for g in remaining})

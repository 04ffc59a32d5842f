"""The reconnection suite: network faults injected with Toxiproxy while messages flow.

Each scenario runs on both topologies of the ``net`` fixture (SDK -> broker and
SDK -> proxy -> broker, with Toxiproxy between the hops); a fault acts on every
hop between the session and the broker unless it says otherwise. Each asserts
the same three things (``tests.faults.checks``): nothing lost, nothing
duplicated in the queue, exactly one ACK per PUT.
"""

from __future__ import annotations

import time
import uuid

import pytest

from holdfast.sdk import (
    AckStatus,
    BandwidthLimitError,
    ConfirmDroppedError,
    ConfirmRejected,
    ConnectionLost,
    Message,
    QueueNotOpenError,
    QueueOptions,
    QueueReopened,
    Session,
    SessionOptions,
)
from tests.faults.checks import (
    Producer,
    assert_exactly_once,
    copies_in_queue,
    drain,
)
from tests.faults.network import LinkFactory, Network, network
from tests.faults.streams import black_hole, check, each, flap, streaming
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import down, link_address, toxic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


# -- faults on a producer's path ------------------------------------------------------


def test_link_disabled_and_reenabled_mid_stream(hop_net: Network) -> None:
    net = hop_net
    with streaming(net, "disable") as s:
        s.wait_acked(300)
        lost, restored = s.losses(), s.restores()
        with down(*net.hops(s.link)):
            net.wait_lost(s.events, lost)
            s.wait_more_posted(300)  # buffered while the link is down
        net.wait_restored(s.events, restored)
        s.wait_acked(len(s.acks) + 300)
    check(s)


def test_black_hole_is_detected_by_keepalive(hop_net: Network) -> None:
    """The ``timeout`` toxic keeps the connections open and drops every byte: only
    keepalive (0.5 s + 1 s here) can tell the link is dead."""
    net = hop_net
    with streaming(net, "blackhole") as s:
        s.wait_acked(300)
        lost, restored = s.losses(), s.restores()
        with black_hole(net.hops(s.link)):
            started = time.monotonic()
            net.wait_lost(s.events, lost)
            detected_in = time.monotonic() - started
            s.wait_more_posted(300)
        net.wait_restored(s.events, restored)
        s.wait_acked(len(s.acks) + 300)
    assert detected_in < 10.0
    check(s)


def test_reset_peer_mid_stream(hop_net: Network) -> None:
    net = hop_net
    with streaming(net, "reset") as s:
        s.wait_acked(300)
        lost, restored = s.losses(), s.restores()
        with each(net.hops(s.link), "reset_peer", stream="upstream", timeout=100):
            net.wait_lost(s.events, lost)
            s.wait_more_posted(200)  # reconnects are reset too while the toxic is on
        net.wait_restored(s.events, restored)
        s.wait_acked(len(s.acks) + 300)
    check(s)


def test_latency_spikes(net: Network) -> None:
    """A spike under the keepalive timeout only slows ACKs down; one over it (a
    1.5 s one-way delay against a 1 s keepalive timeout) is taken for a dead link."""
    with streaming(net, "latency") as s:
        s.wait_acked(300)
        hops = net.hops(s.link)
        with (
            each(hops, "latency", stream="downstream", latency=150, jitter=50),
            each(hops, "latency", stream="upstream", latency=100),
        ):
            s.wait_more_posted(500)
            s.wait_acked(len(s.acks) + 100)  # ACKs still come, late
        lost, restored = s.losses(), s.restores()
        with each(hops, "latency", stream="downstream", latency=1500):
            net.wait_lost(s.events, lost)
            s.wait_more_posted(300)
        net.wait_restored(s.events, restored)
        s.wait_acked(len(s.acks) + 300)
    check(s)


def test_bandwidth_limit_trips_the_high_watermark_in_the_callers_thread(net: Network) -> None:
    """A link throttled to 16 KB/s fills the SDK's outbound buffer: ``post()`` waits
    5 s in the caller's thread, then raises ``BandwidthLimitError`` and does not take
    the message. Keepalive is slowed to 60 s here: its pings would queue behind the
    backlog and take the link for dead.
    The throttle is on the session's own link (the hop whose transport pushes back)."""
    options = SessionOptions(
        keepalive_time=60,
        keepalive_timeout=60,
        high_watermark_bytes=1024 * 1024,
        reconnect=FAST.reconnect,
        close_timeout=5.0,
    )
    link = net.entry("bandwidth")
    uri = unique_uri("bandwidth")
    acks = AckRecorder()
    taken: dict[uuid.UUID, bytes] = {}
    refused = b""
    with Session(link_address(link), options=options) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        with toxic(link, "bandwidth", stream="upstream", rate=16):
            started = time.monotonic()
            with pytest.raises(BandwidthLimitError):
                while time.monotonic() - started < 60:
                    payload = b"%06d-" % len(taken) + b"x" * 100_000
                    post_started = time.monotonic()
                    taken[queue.post(payload)] = payload
            refused = payload
            waited = time.monotonic() - post_started
            pending, reported = session.pending_count, len(acks)
        assert session.flush(timeout=60)
    assert waited >= 5.0  # the refused post() waited the whole window, in this thread
    assert pending + reported == len(taken)  # ...and the message was not taken
    assert refused not in taken.values()
    stored = drain(net.broker.address, uri, len(taken))
    assert_exactly_once(taken, acks, stored)  # a stored refused payload is "unexpected"


def test_flapping_link(net: Network) -> None:
    """Every hop goes down and up at random (seeded) every few hundred ms, each on its
    own schedule, for 4 s."""
    with streaming(net, "flapping") as s:
        s.wait_acked(300)
        lost = s.losses()
        flap(net.hops(s.link), duration=4.0, seed=7)
        assert all(n - b >= 3 for n, b in zip(s.losses(), lost, strict=True)), s.losses()
        s.wait_more_posted(300)
    check(s)


# -- faults on a consumer's path ------------------------------------------------------


def post_all(net: Network, uri: str, count: int) -> tuple[dict[uuid.UUID, bytes], AckRecorder]:
    """Post ``count`` messages through a healthy link of their own; all ACKed."""
    acks = AckRecorder()
    with Session(link_address(net.entry("feed")), options=FAST) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        posted = {}
        for i in range(count):
            payload = b"feed-%06d" % i
            posted[queue.post(payload)] = payload
        assert session.flush(timeout=30)
    return posted, acks


def test_consumer_cut_with_unconfirmed_messages_gets_them_redelivered(hop_net: Network) -> None:
    net = hop_net
    uri = unique_uri("consumer-cut")
    posted, acks = post_all(net, uri, 200)
    first = list(posted)[:50]
    link = net.entry("consumer")
    events = EventRecorder()
    received = MessageRecorder(confirm=False)
    with Session(link_address(link), on_event=events, options=FAST) as consumer:
        consumer.open_queue(
            uri,
            read=True,
            on_message=received,
            options=QueueOptions(max_unconfirmed_messages=50),
        )
        wait_until(lambda: len(received) == 50, 15, "50 unconfirmed deliveries")
        lost = net.losses(events)
        with down(*net.hops(link)):
            net.wait_lost(events, lost)
        # The broker takes the 50 back and delivers them again, ahead of the rest.
        wait_until(lambda: len(received) == 100, 30, "the 50 redeliveries")
        with received.lock:
            redelivered = received.messages[50:]
            received.confirm = True  # from now on every delivery is confirmed
        for message in redelivered:
            message.confirm()
        wait_until(lambda: set(received.guids()) == set(posted), 30, "every message")
        wait_until(lambda: len(received) == 250, 30, "the last deliveries")
    assert [m.guid for m in received.messages[:50]] == first
    assert {m.guid for m in redelivered} == set(first)
    assert all(m.delivery_count >= 2 for m in redelivered)
    assert all(m.delivery_count == 1 for m in received.messages[100:])
    leftover = drain(net.broker.address, uri, 0)
    assert_exactly_once(posted, acks, copies_in_queue(received.messages) + leftover)


def test_confirms_during_an_outage_are_dropped_and_the_messages_redelivered(
    net: Network,
) -> None:
    uri = unique_uri("confirm-outage")
    posted, acks = post_all(net, uri, 20)
    link = net.entry("consumer")
    events = EventRecorder()
    held = MessageRecorder(confirm=False)
    dropped: list[Message] = []
    with Session(link_address(link), on_event=events, options=FAST) as consumer:
        consumer.open_queue(uri, read=True, on_message=held)
        wait_until(lambda: len(held) == 20, 15, "20 deliveries")
        lost, restored = net.losses(events), net.restores(events)
        with down(*net.hops(link)):
            net.wait_lost(events, lost)
            for message in list(held.messages):
                with pytest.raises(ConfirmDroppedError):
                    message.confirm()  # the caller is told: never buffered
                dropped.append(message)
        net.wait_restored(events, restored)
        wait_until(lambda: len(held) == 40, 30, "the 20 redeliveries")
        again = held.messages[20:]
        for message in again:
            message.confirm()
    assert {m.guid for m in again} == {m.guid for m in dropped} == set(posted)
    assert all(m.delivery_count >= 2 for m in again)
    leftover = drain(net.broker.address, uri, 0)  # every confirm after the outage held
    assert leftover == []
    assert_exactly_once(posted, acks, copies_in_queue(held.messages))


def test_close_during_an_outage_is_local_and_the_queue_is_not_reopened(net: Network) -> None:
    """Rule 6: the close succeeds at once, without the broker; the queue's pending PUTs
    are reported UNKNOWN; after the reconnect only the other queue is reopened."""
    link = net.entry("close")
    events, acks, kept_acks = EventRecorder(), AckRecorder(), AckRecorder()
    uri, kept_uri = unique_uri("closed"), unique_uri("kept")
    with Session(link_address(link), on_event=events, options=FAST) as session:
        kept = session.open_queue(kept_uri, write=True, on_ack=kept_acks)
        closing = session.open_queue(uri, write=True, on_ack=acks)
        producer = Producer(closing, "closing").start()
        try:
            wait_until(lambda: len(acks) >= 300, 30, "300 ACKs")
            lost, restored = net.losses(events), net.restores(events)
            with down(*net.hops(link)):
                net.wait_lost(events, lost)
                reopened_before = len(events.of(QueueReopened))
                mark = producer.count  # from here on, posts are only buffered
                producer.wait_posted(mark + 200)
                posted = producer.stop()
                offline = list(posted)[mark:]
                started = time.monotonic()
                closing.close(timeout=10)
                close_took = time.monotonic() - started
                with pytest.raises(QueueNotOpenError):
                    closing.post(b"too late")
                kept_guid = kept.post(b"kept while down")
                wait_until(  # the closed queue's PUTs are all reported, while still down
                    lambda: set(acks.per_guid()) >= set(posted), 5, "UNKNOWN reports"
                )
            net.wait_restored(events, restored)
            assert session.flush(timeout=30)
        finally:
            producer.stop()
    assert close_took < 1.0  # local: no round trip to anyone
    reopened = events.of(QueueReopened)[reopened_before:]
    assert [e.queue_uri for e in reopened if isinstance(e, QueueReopened)] == [kept_uri]
    assert kept_acks.with_status(AckStatus.SUCCESS) == {kept_guid}
    unknown = acks.with_status(AckStatus.UNKNOWN)
    assert len(offline) >= 200 and set(offline) <= unknown
    stored = drain(net.broker.address, uri, len(acks.with_status(AckStatus.SUCCESS)))
    # PUTs posted while the link was down never left the SDK: not in the queue.
    assert not set(offline) & {guid for guid, _ in stored}
    assert_exactly_once(posted, acks, stored, allowed=(AckStatus.SUCCESS, AckStatus.UNKNOWN))


# -- the upstream hop only: the session keeps its proxy ------------------------------


def test_confirms_during_an_upstream_outage_are_refused_and_the_messages_redelivered(
    broker: BrokerProcess, toxic_link: LinkFactory
) -> None:
    """Through the proxy, with only the proxy's link to the broker down: the session is
    connected, so its CONFIRMs reach the proxy, which cannot send them and refuses
    them (the caller hears of it as ``ConfirmRejected``); the broker redelivers."""
    with network("proxy-upstream-hop", broker, toxic_link) as net:
        assert net.upstream is not None
        uri = unique_uri("confirm-upstream-outage")
        posted, acks = post_all(net, uri, 20)
        link = net.entry("consumer")
        events = EventRecorder()
        held = MessageRecorder(confirm=False)
        with Session(link_address(link), on_event=events, options=FAST) as consumer:
            consumer.open_queue(uri, read=True, on_message=held)
            wait_until(lambda: len(held) == 20, 15, "20 deliveries")
            lost, restored = net.losses(events), net.restores(events)
            with down(net.upstream):
                net.wait_lost(events, lost)
                for message in list(held.messages):
                    message.confirm()  # the session's own link is up: no error here
                wait_until(lambda: rejected(events) == set(posted), 10, "20 refusals")
            net.wait_restored(events, restored)
            wait_until(lambda: len(held) == 40, 30, "the 20 redeliveries")
            again = held.messages[20:]
            for message in again:
                message.confirm()
        assert events.of(ConnectionLost) == []
        assert {m.guid for m in again} == set(posted)
        assert all(m.delivery_count >= 2 for m in again)
        assert drain(broker.address, uri, 0) == []
        assert_exactly_once(posted, acks, copies_in_queue(held.messages))


def rejected(events: EventRecorder) -> set[uuid.UUID]:
    """Every GUID named by a ``ConfirmRejected`` event so far."""
    return {
        g for e in events.of(ConfirmRejected) if isinstance(e, ConfirmRejected) for g in e.guids
    }


def test_close_during_an_upstream_outage_is_local_at_the_proxy(
    broker: BrokerProcess, toxic_link: LinkFactory
) -> None:
    """Through the proxy, with only its link to the broker down: the session's close
    reaches the proxy, whose upstream closes the queue locally (rule 6 in the proxy's
    engine): answered at once, the PUTs it held reported UNKNOWN, and the queue not
    reopened upstream when the broker is back."""
    with network("proxy-upstream-hop", broker, toxic_link) as net:
        assert net.upstream is not None and net.proxy is not None
        link = net.entry("close")
        events, acks, kept_acks = EventRecorder(), AckRecorder(), AckRecorder()
        uri, kept_uri = unique_uri("closed"), unique_uri("kept")
        with Session(link_address(link), on_event=events, options=FAST) as session:
            kept = session.open_queue(kept_uri, write=True, on_ack=kept_acks)
            closing = session.open_queue(uri, write=True, on_ack=acks)
            producer = Producer(closing, "closing").start()
            try:
                wait_until(lambda: len(acks) >= 300, 30, "300 ACKs")
                lost, restored = net.losses(events), net.restores(events)
                with down(net.upstream):
                    net.wait_lost(events, lost)
                    mark = producer.count  # from here on, the proxy only buffers them
                    producer.wait_posted(mark + 200)
                    posted = producer.stop()
                    offline = list(posted)[mark:]
                    started = time.monotonic()
                    closing.close(timeout=10)
                    close_took = time.monotonic() - started
                    wait_until(lambda: set(acks.per_guid()) >= set(posted), 5, "every report")
                    kept_guid = kept.post(b"kept while the broker is away")
                net.wait_restored(events, restored)
                assert session.flush(timeout=30)
            finally:
                producer.stop()
        reopened = "QueueReopened(queue_uri='{}'"
        assert net.proxy.count(reopened.format(kept_uri)) >= 1
        assert net.proxy.count(reopened.format(uri)) == 0
    assert close_took < 1.0
    assert events.of(ConnectionLost) == []
    assert kept_acks.with_status(AckStatus.SUCCESS) == {kept_guid}
    unknown = acks.with_status(AckStatus.UNKNOWN)
    assert len(offline) >= 200 and set(offline) <= unknown
    stored = drain(broker.address, uri, len(acks.with_status(AckStatus.SUCCESS)))
    assert not set(offline) & {guid for guid, _ in stored}
    assert_exactly_once(posted, acks, stored, allowed=(AckStatus.SUCCESS, AckStatus.UNKNOWN))

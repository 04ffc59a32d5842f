"""GUID dedup through real gRPC: replays inside the window, and after it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from holdfast.proto import pb
from tests.broker.util import connected, new_guid, options, statuses, unique_uri
from tests.support.columns import PushView, pushes_of
from tests.support.processes import BrokerProcess
from tests.support.wire_client import WireClient

QUIET = 0.3


def drain(client: WireClient, uri: str, expected: int) -> Counter[bytes]:
    """Consume ``uri`` until ``expected`` messages arrived and nothing more comes; the
    number of deliveries of each GUID."""
    assert client.open(99, uri, read=True, options=options(messages=10_000)).status == (
        pb.STATUS_OK
    )
    pushes = client.pushes(expected)
    pushes += [p for f in client.quiet("pushes", QUIET) for p in pushes_of(f.pushes)]
    client.confirm(99, [p.guid for p in pushes])
    return Counter(p.guid for p in pushes)


def test_replay_in_separate_frames_is_acked_and_not_enqueued(
    shared_broker: BrokerProcess,
) -> None:
    uri = unique_uri("dedup-frames")
    guid, other = new_guid(), new_guid()
    with connected(shared_broker.address) as producer:
        producer.open(1, uri, write=True)
        producer.put(1, [(guid, b"first", {})])
        assert statuses(producer.acks(1)) == ["STATUS_OK"]
        producer.put(1, [(guid, b"first", {}), (other, b"other", {})])
        assert statuses(producer.acks(2)) == ["STATUS_OK", "STATUS_OK"]
    # A replay on another session (a client that reconnected) is recognised too.
    with connected(shared_broker.address) as reconnected:
        reconnected.open(1, uri, write=True)
        reconnected.put(1, [(guid, b"first", {})])
        assert statuses(reconnected.acks(1)) == ["STATUS_OK"]
        assert drain(reconnected, uri, 2) == Counter({guid: 1, other: 1})


def test_replay_in_one_frame_is_acked_twice_and_enqueued_once(
    shared_broker: BrokerProcess,
) -> None:
    uri = unique_uri("dedup-batch")
    guid = new_guid()
    with connected(shared_broker.address) as client:
        client.open(1, uri, write=True)
        client.put(1, [(guid, b"one", {}), (guid, b"one", {})])
        acks = client.acks(2)
        assert [(a.guid, a.status) for a in acks] == [(guid, pb.STATUS_OK)] * 2
        received = drain(client, uri, 1)
    assert received == Counter({guid: 1})


def test_the_same_guid_on_two_queues_is_two_messages(shared_broker: BrokerProcess) -> None:
    first, second = unique_uri("dedup-q1"), unique_uri("dedup-q2")
    guid = new_guid()
    with connected(shared_broker.address) as client:
        client.open(1, first, write=True)
        client.open(2, second, write=True)
        client.put(1, [(guid, b"a", {})])
        client.put(2, [(guid, b"b", {})])
        assert statuses(client.acks(2)) == ["STATUS_OK"] * 2
        assert drain(client, first, 1) == Counter({guid: 1})
        client.close_queue(99)
        assert drain(client, second, 1) == Counter({guid: 1})


def test_confirmed_guid_is_still_remembered(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("dedup-confirmed")
    guid = new_guid()
    with connected(shared_broker.address) as client:
        client.open(1, uri, write=True)
        client.put(1, [(guid, b"x", {})])
        client.acks(1)
        assert drain(client, uri, 1) == Counter({guid: 1})  # consumed and confirmed
        client.put(1, [(guid, b"x", {})])
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert client.quiet("pushes", QUIET) == []


def test_a_fresh_post_after_window_and_grace_is_enqueued_again(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    window, grace = 1.0, 0.5
    broker = broker_factory("--dedup-window", str(window), "--dedup-grace", str(grace))
    uri = unique_uri("dedup-expiry")
    guid = new_guid()
    with connected(broker.address) as producer, connected(broker.address) as consumer:
        assert producer.hello_reply is not None
        assert producer.hello_reply.dedup_window_ms == 1000  # the window, not the grace
        consumer.open(1, uri, read=True)
        producer.open(1, uri, write=True)
        sent_at = time.monotonic()
        producer.put(1, [(guid, b"same", {})])
        assert statuses(producer.acks(1)) == ["STATUS_OK"]
        (first,) = consumer.pushes(1)
        consumer.confirm(1, [first.guid])
        # A post of age 0 every 100 ms (a producer reusing the GUID) until one is enqueued
        # again: each is ACKed OK, and none gets in before window + grace have passed.
        replays = 0
        deadline = time.monotonic() + 10 * window
        second: list[PushView] = []
        while not second:
            assert time.monotonic() < deadline, "the post was never enqueued again"
            producer.put(1, [(guid, b"same", {})])
            assert statuses(producer.acks(1)) == ["STATUS_OK"]
            replays += 1
            second = [p for f in consumer.quiet("pushes", 0.1) for p in pushes_of(f.pushes)]
        enqueued_at = time.monotonic()
    assert enqueued_at - sent_at >= window + grace
    assert replays > 1
    assert [(p.guid, p.payload, p.delivery_count) for p in second] == [(guid, b"same", 1)]

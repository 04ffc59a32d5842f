"""Delivery through real gRPC: round-robin, flow limits, CONFIRM, redelivery, ordering."""

from __future__ import annotations

from holdfast.proto import pb
from tests.broker.util import connected, new_guid, options, statuses, unique_uri
from tests.support.columns import pushes_of
from tests.support.processes import BrokerProcess
from tests.support.wire_client import WireClient

QUIET = 0.3
"""Seconds a test waits to see that nothing more is PUSHed."""


def produce(address: str, uri: str, payloads: list[bytes]) -> list[bytes]:
    """PUT ``payloads`` to ``uri`` in one frame, wait for every ACK; their GUIDs."""
    guids = [new_guid() for _ in payloads]
    with connected(address) as producer:
        assert producer.open(1, uri, write=True).status == pb.STATUS_OK
        producer.put(1, [(g, p, {}) for g, p in zip(guids, payloads, strict=True)])
        acks = producer.acks(len(guids))
    assert [a.guid for a in acks] == guids
    assert set(statuses(acks)) == {"STATUS_OK"}
    return guids


def consume(client: WireClient, queue_id: int, uri: str, **limits: int) -> None:
    response = client.open(queue_id, uri, read=True, options=options(**limits))
    assert response.status == pb.STATUS_OK


def extra_pushes(client: WireClient) -> int:
    return sum(len(pushes_of(f.pushes)) for f in client.quiet("pushes", QUIET))


def test_round_robin_over_two_consumers(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("rr")
    with connected(shared_broker.address) as a, connected(shared_broker.address) as b:
        consume(a, 1, uri)
        consume(b, 7, uri)
        guids = produce(shared_broker.address, uri, [b"m%d" % i for i in range(10)])
        to_a = a.pushes(5)
        to_b = b.pushes(5)
        assert extra_pushes(a) == extra_pushes(b) == 0
    assert {p.queue_id for p in to_a} == {1}
    assert {p.queue_id for p in to_b} == {7}
    # Alternating: A got messages 0, 2, 4, ..., B got 1, 3, 5, ...
    # A is first in the rotation.
    assert [p.guid for p in to_a] == guids[0::2]
    assert [p.guid for p in to_b] == guids[1::2]
    assert all(p.delivery_count == 1 for p in to_a + to_b)


def test_push_carries_payload_properties_and_guid(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("props")
    guid = new_guid()
    with connected(shared_broker.address) as client:
        client.open(1, uri, read=True, write=True)
        client.put(1, [(guid, b"\x00payload\xff", {"k": "v", "empty": ""})])
        (ack,) = client.acks(1)
        (push,) = client.pushes(1)
    assert (ack.queue_id, ack.guid, ack.status) == (1, guid, pb.STATUS_OK)
    assert (push.queue_id, push.guid, push.payload) == (1, guid, b"\x00payload\xff")
    assert dict(push.properties) == {"k": "v", "empty": ""}
    assert push.delivery_count == 1


def test_message_limit_holds_pushes_until_a_confirm(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("limit-messages")
    produce(shared_broker.address, uri, [b"m%d" % i for i in range(10)])
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri, messages=3)
        first = consumer.pushes(3)
        assert len(first) == 3
        assert extra_pushes(consumer) == 0
        consumer.confirm(1, [first[0].guid])
        assert len(consumer.pushes(1)) == 1
        assert extra_pushes(consumer) == 0
        consumer.confirm(1, [first[1].guid, first[2].guid])
        assert len(consumer.pushes(2)) == 2
        assert extra_pushes(consumer) == 0


def test_byte_limit_holds_pushes_until_a_confirm(shared_broker: BrokerProcess) -> None:
    """Delivery stops while the consumer holds ``max_unconfirmed_bytes`` or more: with 100
    byte payloads and a 250 byte limit it holds 3 (0, 100, 200 < 250; 300 is not)."""
    uri = unique_uri("limit-bytes")
    produce(shared_broker.address, uri, [bytes([i]) * 100 for i in range(10)])
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri, size=250)
        first = consumer.pushes(3)
        assert len(first) == 3
        assert extra_pushes(consumer) == 0
        consumer.confirm(1, [first[0].guid])
        assert len(consumer.pushes(1)) == 1
        assert extra_pushes(consumer) == 0


def test_zero_limits_pause_and_configure_resumes(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("pause")
    produce(shared_broker.address, uri, [b"m%d" % i for i in range(5)])
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri, messages=0)
        consume(consumer, 2, uri, size=0)
        assert extra_pushes(consumer) == 0
        assert consumer.configure(2, options(messages=2)).status == pb.STATUS_OK
        pushes = consumer.pushes(2)
        assert {p.queue_id for p in pushes} == {2}
        assert extra_pushes(consumer) == 0
        assert consumer.configure(1, options()).status == pb.STATUS_OK
        assert {p.queue_id for p in consumer.pushes(3)} == {1}
        # Paused again, handle 1 receives nothing new; handle 2 is full until it confirms.
        assert consumer.configure(1, options(messages=0)).status == pb.STATUS_OK
        later = produce(shared_broker.address, uri, [b"later1", b"later2"])
        assert extra_pushes(consumer) == 0
        consumer.confirm(2, [p.guid for p in pushes])
        again = consumer.pushes(2)
        assert [(p.queue_id, p.guid) for p in again] == [(2, g) for g in later]
        assert extra_pushes(consumer) == 0


def test_absent_options_mean_the_documented_defaults(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("defaults")
    produce(shared_broker.address, uri, [b"%d" % i for i in range(1005)])
    with connected(shared_broker.address) as consumer:
        assert consumer.open(1, uri, read=True).status == pb.STATUS_OK  # no QueueOptions
        assert len(consumer.pushes(1000)) == 1000
        assert extra_pushes(consumer) == 0


def test_unconfirmed_messages_go_to_the_remaining_consumer(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("redeliver")
    with connected(shared_broker.address) as stays:
        consume(stays, 1, uri)
        leaves = WireClient(shared_broker.address)
        leaves.hello()
        consume(leaves, 1, uri)
        produce(shared_broker.address, uri, [b"m%d" % i for i in range(6)])
        held = leaves.pushes(3)
        kept = stays.pushes(3)
        stays.confirm(1, [p.guid for p in kept])
        leaves.close()  # gone without confirming
        again = stays.pushes(3)
    assert [p.guid for p in again] == [p.guid for p in held]
    assert [p.payload for p in again] == [p.payload for p in held]
    assert all(p.delivery_count == 1 for p in held + kept)
    assert all(p.delivery_count == 2 for p in again)


def test_unconfirmed_messages_go_to_a_returning_consumer(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("return")
    guids = produce(shared_broker.address, uri, [b"m%d" % i for i in range(6)])
    with connected(shared_broker.address) as first:
        consume(first, 1, uri, messages=4)
        assert [p.guid for p in first.pushes(4)] == guids[:4]
        first.confirm(1, [guids[1]])
        first.barrier()
        assert [p.guid for p in first.pushes(1)] == [guids[4]]
    # guids[5] never left the queue; the unconfirmed ones go back in front of it.
    for delivery in (2, 3):
        with connected(shared_broker.address) as again:
            consume(again, 1, uri)
            pushes = again.pushes(5)
            assert extra_pushes(again) == 0
        assert [p.guid for p in pushes] == [guids[0], *guids[2:]]
        assert [p.delivery_count for p in pushes] == [delivery] * 4 + [delivery - 1]


def test_close_queue_returns_unconfirmed_messages(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("close")
    guids = produce(shared_broker.address, uri, [b"a", b"b"])
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri)
        assert [p.guid for p in consumer.pushes(2)] == guids
        assert consumer.close_queue(1).status == pb.STATUS_OK
        consume(consumer, 1, uri)
        again = consumer.pushes(2)
    assert [(p.guid, p.delivery_count) for p in again] == [(g, 2) for g in guids]


def test_confirm_removes_the_message_for_good(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("confirm")
    guids = produce(shared_broker.address, uri, [b"a", b"b", b"c"])
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri)
        assert len(consumer.pushes(3)) == 3
        consumer.confirm(1, guids[:2])
        consumer.barrier()
        # A confirm that was accepted gets no answer; a bad one would get an Error.
        assert consumer.poll("error") is None
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri)
        (push,) = consumer.pushes(1)
        consumer.confirm(1, [push.guid])
        consumer.barrier()
        assert extra_pushes(consumer) == 0
        assert (push.guid, push.delivery_count) == (guids[2], 2)
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri)
        assert extra_pushes(consumer) == 0


def test_acks_and_responses_keep_the_order_of_their_frames(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("order")
    with connected(shared_broker.address) as client:
        client.open(1, uri, write=True)
        rounds = 50
        for _ in range(rounds):
            client.put(1, [(new_guid(), b"x", {})])
            client.send(
                pb.ClientFrame(
                    configure_queue=pb.ConfigureQueue(
                        request_id=client.request_id(), queue_id=1, options=options()
                    )
                )
            )
        client.put(1, [(new_guid(), b"last", {})])
        request_id = client.request_id()
        client.send(pb.ClientFrame(close_queue=pb.CloseQueue(request_id=request_id, queue_id=1)))
        frames = [client.recv() for _ in range(2 * rounds + 2)]
    kinds = [f.WhichOneof("frame") for f in frames]
    assert kinds == ["acks", "response"] * (rounds + 1)
    assert frames[-1].response.request_id == request_id


def test_consumer_order_is_put_order(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("fifo")
    with connected(shared_broker.address) as producer:
        producer.open(1, uri, write=True)
        guids = [new_guid() for _ in range(3000)]
        for start in range(0, len(guids), 100):
            producer.put(1, [(g, b"p", {}) for g in guids[start : start + 100]])
        acks = producer.acks(len(guids))
    assert [a.guid for a in acks] == guids
    with connected(shared_broker.address) as consumer:
        consume(consumer, 1, uri, messages=len(guids))
        assert [p.guid for p in consumer.pushes(len(guids))] == guids

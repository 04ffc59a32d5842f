"""Every kind of bad input gets its typed answer, and another client on the same broker
keeps working after each one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from holdfast.proto import PROTOCOL_VERSION, pb
from tests.broker.util import connected, new_guid, statuses, unique_uri
from tests.support.columns import pushes_of
from tests.support.processes import BrokerProcess
from tests.support.wire_client import WireClient

MAX_PAYLOAD = 1000
MAX_PROPERTIES = 64
MAX_PROPERTIES_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def small_broker() -> Iterator[BrokerProcess]:
    """One broker with a small payload limit for the whole module."""
    with BrokerProcess(["--max-payload-bytes", str(MAX_PAYLOAD)]) as process:
        yield process


class Bystander:
    """A producer and a consumer of a queue of their own, on the same broker."""

    def __init__(self, address: str) -> None:
        self.uri = unique_uri("bystander")
        self.producer = WireClient(address)
        self.consumer = WireClient(address)
        self.producer.hello()
        self.consumer.hello()
        assert self.producer.open(1, self.uri, write=True).status == pb.STATUS_OK
        assert self.consumer.open(1, self.uri, read=True).status == pb.STATUS_OK

    def assert_works(self) -> None:
        """A PUT is ACKed OK and PUSHed to the consumer, which confirms it."""
        guid = new_guid()
        self.producer.put(1, [(guid, b"still here", {})])
        (ack,) = self.producer.acks(1)
        assert (ack.guid, ack.status) == (guid, pb.STATUS_OK)
        (push,) = self.consumer.pushes(1)
        assert (push.guid, push.payload) == (guid, b"still here")
        self.consumer.confirm(1, [guid])
        self.consumer.barrier()
        assert self.consumer.poll("error") is None

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


@pytest.fixture
def bystander(small_broker: BrokerProcess) -> Iterator[Bystander]:
    """Another client that must not notice the bad input; checked after the test too."""
    other = Bystander(small_broker.address)
    other.assert_works()
    try:
        yield other
        other.assert_works()
        assert small_broker.running
    finally:
        other.close()


@pytest.fixture
def client(small_broker: BrokerProcess) -> Iterator[WireClient]:
    """The misbehaving client, after Hello."""
    with connected(small_broker.address) as wire:
        yield wire


def assert_error(client: WireClient, status: int, fatal: bool = False) -> pb.Error:
    error: pb.Error = client.recv("error").error
    assert pb.Status.Name(error.status) == pb.Status.Name(status)
    assert error.fatal is fatal
    assert error.message
    return error


def assert_stream_still_usable(client: WireClient) -> None:
    uri = unique_uri("usable")
    assert client.open(50, uri, write=True).status == pb.STATUS_OK
    client.put(50, [(new_guid(), b"ok", {})])
    assert statuses(client.acks(1)) == ["STATUS_OK"]
    assert client.close_queue(50).status == pb.STATUS_OK


# -- frames that are not frames ---------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\xff",  # a length-delimited field longer than the message
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a varint that never ends
        # An OpenQueue whose URI is not valid UTF-8.
        pb.ClientFrame(open_queue=pb.OpenQueue(request_id=1, uri="hf://a/b"))
        .SerializeToString()
        .replace(b"hf://a/b", b"hf://\xff/b"),
    ],
    ids=["truncated", "endless-varint", "bad-utf8"],
)
def test_malformed_bytes(client: WireClient, bystander: Bystander, raw: bytes) -> None:
    client.send_raw(raw)
    assert_error(client, pb.STATUS_MALFORMED_FRAME)
    bystander.assert_works()
    assert_stream_still_usable(client)


def test_frame_with_nothing_set(client: WireClient, bystander: Bystander) -> None:
    client.send(pb.ClientFrame())
    assert_error(client, pb.STATUS_UNKNOWN_FRAME)
    # A frame from a newer peer: a field number this broker does not know.
    client.send_raw(b"\x7a\x00")  # field 15, length 0
    assert_error(client, pb.STATUS_UNKNOWN_FRAME)
    bystander.assert_works()
    assert_stream_still_usable(client)


def test_empty_batches_are_harmless(client: WireClient, bystander: Bystander) -> None:
    client.send(pb.ClientFrame(puts=pb.PutBatch()))
    client.send(pb.ClientFrame(confirms=pb.ConfirmBatch()))
    client.barrier()
    assert client.poll() is None  # nothing to answer, and no empty frame either
    bystander.assert_works()
    assert_stream_still_usable(client)


# -- requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "hf://",
        "hf://domain",
        "hf://domain/",
        "hf:///queue",
        "http://domain/queue",
        "hf://domain/queue/extra",
        "hf://-domain/queue",
        "hf://domain/que ue",
        "hf://domain/" + "q" * 129,
        "HF://domain/queue",
        "hf://domain/queue\n",  # not the queue hf://domain/queue
    ],
)
def test_bad_uri(client: WireClient, bystander: Bystander, uri: str) -> None:
    response = client.open(1, uri, write=True)
    assert response.status == pb.STATUS_INVALID_ARGUMENT
    assert "URI" in response.message
    bystander.assert_works()
    # The handle was not taken: the same queue_id opens fine afterwards.
    assert client.open(1, unique_uri("after-bad-uri"), write=True).status == pb.STATUS_OK


def test_huge_uri_gets_a_short_typed_answer(client: WireClient, bystander: Bystander) -> None:
    # Echoing a 3 MiB URI would make a 12 MiB reply (repr of every byte), over the gRPC
    # message limit: the stream would die instead of getting its typed answer.
    response = client.open(1, "hf://domain/" + "\x00" * (3 * 1024 * 1024), write=True)
    assert response.status == pb.STATUS_INVALID_ARGUMENT
    assert len(response.message) < 400
    assert "3145740 characters" in response.message
    bystander.assert_works()
    assert_stream_still_usable(client)


def test_open_without_read_or_write(client: WireClient, bystander: Bystander) -> None:
    response = client.open(1, unique_uri("neither"))
    assert response.status == pb.STATUS_INVALID_ARGUMENT
    bystander.assert_works()


def test_duplicate_queue_id(client: WireClient, bystander: Bystander) -> None:
    first = unique_uri("dup-id")
    assert client.open(3, first, write=True).status == pb.STATUS_OK
    assert client.open(3, unique_uri("dup-id"), read=True).status == pb.STATUS_ALREADY_OPEN
    bystander.assert_works()
    # The first open is untouched.
    client.put(3, [(new_guid(), b"x", {})])
    assert statuses(client.acks(1)) == ["STATUS_OK"]


def test_unknown_queue_id(client: WireClient, bystander: Bystander) -> None:
    assert client.close_queue(8).status == pb.STATUS_UNKNOWN_QUEUE
    configure = pb.ConfigureQueue(request_id=client.request_id(), queue_id=8)
    client.send(pb.ClientFrame(configure_queue=configure))
    assert client.response(configure.request_id).status == pb.STATUS_UNKNOWN_QUEUE
    guid = new_guid()
    client.put(8, [(guid, b"x", {})])
    (ack,) = client.acks(1)
    assert (ack.queue_id, ack.guid, ack.status) == (8, guid, pb.STATUS_UNKNOWN_QUEUE)
    client.confirm(8, [guid])
    error = assert_error(client, pb.STATUS_UNKNOWN_QUEUE)
    assert (error.queue_id, list(error.guids)) == (8, [guid])
    bystander.assert_works()
    # A closed handle is unknown too.
    client.open(9, unique_uri("closed"), write=True)
    assert client.close_queue(9).status == pb.STATUS_OK
    client.put(9, [(guid, b"x", {})])
    assert statuses(client.acks(1)) == ["STATUS_UNKNOWN_QUEUE"]


# -- PUTs -------------------------------------------------------------------------------


def test_guids_of_the_wrong_size(client: WireClient, bystander: Bystander) -> None:
    """A columnar batch cannot carry a GUID of another size: a GUID column that is not
    16 bytes a message is a malformed frame, refused whole, and the session goes on."""
    uri = unique_uri("guid-size")
    client.open(1, uri, write=True, read=True)
    client.put_columns(
        pb.PutBatch(queue_ids=[1], guids=b"g" * 31, payloads=b"ab", payload_lengths=[1, 1])
    )
    error = assert_error(client, pb.STATUS_MALFORMED_FRAME)
    assert "31 bytes" in error.message
    good = new_guid()
    client.put(1, [(good, b"good", {})])
    assert statuses(client.acks(1)) == ["STATUS_OK"]
    (push,) = client.pushes(1)  # only the good one was enqueued
    assert push.guid == good
    assert client.quiet("pushes", 0.3) == []
    bystander.assert_works()


@pytest.mark.parametrize(
    ("batch", "complaint"),
    [
        (dict(payloads=b"abc", payload_lengths=[1, 1]), "sum to 2, not 3"),
        (dict(payloads=b"ab", payload_lengths=[2]), "1 payload lengths"),
        (dict(payloads=b"ab", payload_lengths=[1, 1], ages_ms=[5]), "1 ages_ms"),
        (dict(payloads=b"ab", payload_lengths=[1, 1], queue_ids=[1, 1, 1]), "3 queue_ids"),
    ],
)
def test_columns_that_disagree_are_a_malformed_frame(
    client: WireClient, bystander: Bystander, batch: dict[str, Any], complaint: str
) -> None:
    uri = unique_uri("columns")
    client.open(1, uri, write=True, read=True)
    fields: dict[str, Any] = {"queue_ids": [1], "guids": new_guid() + new_guid(), **batch}
    client.put_columns(pb.PutBatch(**fields))
    error = assert_error(client, pb.STATUS_MALFORMED_FRAME)
    assert complaint in error.message
    assert not error.fatal
    assert client.quiet("acks", 0.3) == []  # no PUT of it was taken, so none is ACKed
    bystander.assert_works()


@pytest.mark.parametrize(
    ("groups", "complaint"),
    [
        ([{"indexes": [2], "keys": ["k"], "values": ["v"]}], "properties for message 2 of a"),
        (
            [
                {"indexes": [0], "keys": ["k"], "values": ["v"]},
                {"indexes": [0], "keys": ["j"], "values": ["w"]},
            ],
            "in two property groups",
        ),
        ([{"indexes": [0, 0], "keys": ["k"], "values": ["v", "w"]}], "twice in one"),
        ([{"indexes": [0], "keys": ["k", "k"], "values": ["v", "w"]}], "not distinct"),
        ([{"indexes": [0], "keys": [], "values": []}], "not distinct"),
        ([{"indexes": [0, 1], "keys": ["k"], "values": ["v"]}], "with 1 values"),
        ([{"indexes": [], "keys": ["k"], "values": ["v"]}], "0 messages and 1 keys"),
    ],
)
def test_property_groups_that_do_not_fit_the_batch(
    client: WireClient, bystander: Bystander, groups: list[dict[str, Any]], complaint: str
) -> None:
    """Properties travel grouped by their keys (``PropertyGroup``); a group that names a
    message past the batch or one already named, names a key twice (or none), or
    carries other than one value per message and key cannot be read: the frame is
    MALFORMED, none of its PUTs is taken, and the stream goes on."""
    client.open(1, unique_uri("props-groups"), write=True)
    batch = pb.PutBatch(
        queue_ids=[1], guids=new_guid() + new_guid(), payloads=b"ab", payload_lengths=[1, 1]
    )
    for group in groups:
        batch.property_groups.add(**group)
    client.put_columns(batch)
    error = assert_error(client, pb.STATUS_MALFORMED_FRAME)
    assert complaint in error.message and not error.fatal
    assert client.quiet("acks", 0.3) == []
    bystander.assert_works()


def test_payload_limit(client: WireClient, bystander: Bystander) -> None:
    assert client.hello_reply is not None
    assert client.hello_reply.max_payload_bytes == MAX_PAYLOAD
    client.open(1, unique_uri("payload"), write=True, read=True)
    exact, over = new_guid(), new_guid()
    client.put(1, [(over, b"o" * (MAX_PAYLOAD + 1), {}), (exact, b"e" * MAX_PAYLOAD, {})])
    acks = client.acks(2)
    assert [(a.guid, pb.Status.Name(a.status)) for a in acks] == [
        (over, "STATUS_PAYLOAD_TOO_LARGE"),
        (exact, "STATUS_OK"),
    ]
    (push,) = client.pushes(1)
    assert (push.guid, push.payload) == (exact, b"e" * MAX_PAYLOAD)
    bystander.assert_works()


def test_property_limits(client: WireClient, bystander: Bystander) -> None:
    assert client.hello_reply is not None
    assert client.hello_reply.max_properties == MAX_PROPERTIES
    assert client.hello_reply.max_properties_bytes == MAX_PROPERTIES_BYTES
    client.open(1, unique_uri("props"), write=True, read=True)
    most = {f"k{i}": "v" for i in range(MAX_PROPERTIES)}
    too_many = {f"k{i}": "v" for i in range(MAX_PROPERTIES + 1)}
    too_big = {"big": "x" * MAX_PROPERTIES_BYTES}
    # Sizes count UTF-8 bytes: 2 bytes per "é".
    too_big_utf8 = {"k": "é" * (MAX_PROPERTIES_BYTES // 2)}
    guids = [new_guid() for _ in range(4)]
    client.put(
        1,
        [
            (guids[0], b"a", too_many),
            (guids[1], b"b", too_big),
            (guids[2], b"c", too_big_utf8),
            (guids[3], b"d", most),
        ],
    )
    assert statuses(client.acks(4)) == ["STATUS_INVALID_PROPERTIES"] * 3 + ["STATUS_OK"]
    (push,) = client.pushes(1)
    assert (push.guid, dict(push.properties)) == (guids[3], most)
    bystander.assert_works()


def test_put_on_a_read_only_queue(client: WireClient, bystander: Bystander) -> None:
    client.open(1, unique_uri("read-only"), read=True)
    guid = new_guid()
    client.put(1, [(guid, b"x", {})])
    (ack,) = client.acks(1)
    assert (ack.queue_id, ack.guid, ack.status) == (1, guid, pb.STATUS_NOT_WRITABLE)
    assert client.quiet("pushes", 0.2) == []
    bystander.assert_works()


# -- CONFIRMs ---------------------------------------------------------------------------


def test_confirm_of_an_unknown_guid(client: WireClient, bystander: Bystander) -> None:
    uri = unique_uri("confirm-unknown")
    client.open(1, uri, read=True, write=True)
    real = new_guid()
    client.put(1, [(real, b"x", {})])
    client.acks(1)
    client.pushes(1)
    unknown = [new_guid(), new_guid()]
    client.confirm(1, [unknown[0], real, unknown[1]])
    error = assert_error(client, pb.STATUS_UNKNOWN_GUID)
    assert (error.queue_id, list(error.guids)) == (1, unknown)
    # The real one was confirmed: confirming it again is unknown now.
    client.confirm(1, [real])
    assert list(assert_error(client, pb.STATUS_UNKNOWN_GUID).guids) == [real]
    bystander.assert_works()


def test_confirm_of_a_message_held_by_another_consumer(
    small_broker: BrokerProcess, bystander: Bystander
) -> None:
    with connected(small_broker.address) as thief:
        thief.open(1, bystander.uri, read=True)
        thief.confirm(1, [new_guid()])
        assert_error(thief, pb.STATUS_UNKNOWN_GUID)
        guid = new_guid()
        thief.close_queue(1)
        bystander.producer.put(1, [(guid, b"mine", {})])
        bystander.producer.acks(1)
        (push,) = bystander.consumer.pushes(1)
        thief.open(1, bystander.uri, read=True)
        thief.confirm(1, [push.guid])
        assert list(assert_error(thief, pb.STATUS_UNKNOWN_GUID).guids) == [guid]
        thief.close_queue(1)
    bystander.consumer.confirm(1, [guid])
    bystander.consumer.barrier()
    assert bystander.consumer.poll("error") is None


def test_confirm_on_a_write_only_queue(client: WireClient, bystander: Bystander) -> None:
    client.open(1, unique_uri("write-only"), write=True)
    guid = new_guid()
    client.confirm(1, [guid])
    error = assert_error(client, pb.STATUS_NOT_READABLE)
    assert (error.queue_id, list(error.guids)) == (1, [guid])
    bystander.assert_works()


# -- the handshake: fatal ---------------------------------------------------------------


def test_frames_before_hello(small_broker: BrokerProcess, bystander: Bystander) -> None:
    with WireClient(small_broker.address) as early:
        early.send(pb.ClientFrame(open_queue=pb.OpenQueue(request_id=1, uri=unique_uri("x"))))
        assert_error(early, pb.STATUS_PROTOCOL_ERROR, fatal=True)
        assert early.ended().code.name == "OK"
    bystander.assert_works()


def test_protocol_version_mismatch(small_broker: BrokerProcess, bystander: Bystander) -> None:
    with WireClient(small_broker.address) as future:
        future.send_hello(protocol_version=PROTOCOL_VERSION + 1)
        error = assert_error(future, pb.STATUS_VERSION_MISMATCH, fatal=True)
        assert str(PROTOCOL_VERSION) in error.message
        assert future.ended().code.name == "OK"
        assert future.poll("hello_reply") is None
    bystander.assert_works()


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_peer_is_refused_with_a_typed_error(
    small_broker: BrokerProcess, bystander: Bystander, version: int
) -> None:
    """A peer of protocol 1 (a message per row in each batch) or 2 (a map of properties
    per message) cannot be read: its Hello is answered VERSION_MISMATCH, naming both
    versions, and the stream ends."""
    assert PROTOCOL_VERSION == 3
    with WireClient(small_broker.address) as old:
        old.send_hello(protocol_version=version)
        error = assert_error(old, pb.STATUS_VERSION_MISMATCH, fatal=True)
        assert f"protocol version {version}" in error.message and "version 3" in error.message
        assert old.ended().code.name == "OK"
        assert old.poll("hello_reply") is None
    bystander.assert_works()


def test_second_hello(client: WireClient, bystander: Bystander) -> None:
    client.send_hello()
    assert_error(client, pb.STATUS_PROTOCOL_ERROR, fatal=True)
    assert client.ended().code.name == "OK"
    bystander.assert_works()


def test_a_client_that_vanishes_mid_batch(
    small_broker: BrokerProcess, bystander: Bystander
) -> None:
    for _ in range(3):
        vanishing = WireClient(small_broker.address)
        vanishing.hello()
        vanishing.open(1, bystander.uri, write=True, read=True)
        vanishing.put(1, [(new_guid(), b"v", {}) for _ in range(500)])
        vanishing.close()
    # Whatever it managed to PUT went to the queue's consumers, the bystander included.
    bystander.consumer.barrier()
    while frames := bystander.consumer.quiet("pushes", 0.3):
        bystander.consumer.confirm(1, [p.guid for f in frames for p in pushes_of(f.pushes)])
    bystander.assert_works()

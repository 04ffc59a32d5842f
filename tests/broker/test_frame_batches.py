"""Several frames in one gRPC message against a real broker and a real proxy: both
announce that they read ``ClientFrames``, handle each frame of one in order as if it
had come alone, refuse a Hello or a batch inside a batch, and send ``ServerFrames``
only to a client whose Hello asked for them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from holdfast.proto import pb
from holdfast.proto.batching import pack
from holdfast.proto.columns import put_batch
from tests.broker.util import new_guid, options, unique_uri
from tests.support.columns import pushes_of
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.wire_client import WireClient


@pytest.fixture(params=["broker", "proxy"])
def address(request: pytest.FixtureRequest, broker: BrokerProcess) -> Iterator[str]:
    """The broker's address, or a proxy's in front of it."""
    if request.param == "broker":
        yield broker.address
        return
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        yield proxy.address


def frame(**kind: object) -> bytes:
    return pb.ClientFrame(**kind).SerializeToString()  # type: ignore[arg-type]


def flatten(frames: list[pb.ServerFrame]) -> list[pb.ServerFrame]:
    """Each frame of the batches among ``frames`` in its place."""
    out: list[pb.ServerFrame] = []
    for each in frames:
        out.extend(each.batch.frames if each.WhichOneof("frame") == "batch" else [each])
    return out


def test_a_batch_is_handled_frame_by_frame_in_order(address: str) -> None:
    uri = unique_uri("batch")
    guids = [new_guid() for _ in range(3)]
    with WireClient(address) as client:
        assert client.hello().accepts_batches
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        puts = put_batch([1, 1], guids[:2], [b"x", b"x"])
        more = put_batch([1], guids[2:], [b"y"])
        count = pb.CountConsumers(request_id=client.request_id(), uri=uri)
        client.send_raw(pack([frame(puts=puts), frame(puts=more), frame(count_consumers=count)]))
        acks = client.acks(3)
        assert [a.guid for a in acks] == guids
        assert [a.status for a in acks] == [pb.STATUS_OK] * 3
        answer = client.recv("consumer_count").consumer_count
        assert answer.request_id == count.request_id and answer.consumers == 0


@pytest.mark.parametrize("inner", ["hello", "batch"])
def test_a_hello_or_a_batch_inside_a_batch_ends_the_stream(address: str, inner: str) -> None:
    with WireClient(address) as client:
        client.hello()
        nested = (
            frame(hello=pb.Hello(protocol_version=1))
            if inner == "hello"
            else pack([frame(count_consumers=pb.CountConsumers())])
        )
        client.send_raw(pack([nested]))
        error = client.recv("error").error
        assert error.status == pb.STATUS_PROTOCOL_ERROR and error.fatal
        assert "inside a batch" in error.message


def test_a_batch_before_hello_ends_the_stream(address: str) -> None:
    with WireClient(address) as client:
        client.send_raw(pack([frame(hello=pb.Hello(protocol_version=1))]))
        error = client.recv("error").error
        assert error.status == pb.STATUS_PROTOCOL_ERROR and error.fatal


@pytest.mark.parametrize("accepts", [True, False])
def test_server_frames_are_batched_only_for_a_client_that_asked(
    address: str, accepts: bool
) -> None:
    """300 messages wait; a consumer opens the queue: its PUSHes go in frames of at
    most 256, ready at once, so they leave as one batch to a client that reads them."""
    uri = unique_uri("batched-pushes")
    guids = [new_guid() for _ in range(300)]
    with WireClient(address) as producer, WireClient(address) as consumer:
        producer.hello()
        assert producer.open(1, uri, write=True).status == pb.STATUS_OK
        producer.put(1, [(g, b"m", {}) for g in guids])
        producer.acks(300)
        consumer.hello(accepts_batches=accepts)
        opened = pb.OpenQueue(
            request_id=consumer.request_id(), queue_id=1, uri=uri, read=True, options=options()
        )
        consumer.send(pb.ClientFrame(open_queue=opened))
        got: list[pb.ServerFrame] = []
        while sum(len(pushes_of(f.pushes)) for f in flatten(got)) < 300:
            got.append(consumer.recv())
        kinds = [f.WhichOneof("frame") for f in got]
        assert ("batch" in kinds) is accepts, kinds
        pushed = [p.guid for f in flatten(got) for p in pushes_of(f.pushes)]
        assert pushed == guids

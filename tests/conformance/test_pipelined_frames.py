"""Frames sent behind an OpenQueue without waiting for its answer, on every store,
directly and through the proxy: the broker takes a client's frames in order, so PUTs
and a ConfigureQueue right behind the open find the queue open, and a CloseQueue
behind them comes after their ACKs. The proxy opens upstream asynchronously; it holds
such frames until the open is answered (``holdfast.proxy.opening``). The SDK always
waits for its opens, so only a client of the wire contract shows this."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import put_batch
from tests.conformance.harness import World
from tests.conformance.support import wait_ready
from tests.support.wire_client import WireClient

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60)]


def pipelined(uri: str, guids: list[bytes]) -> list[pb.ClientFrame]:
    """Open, PUT, configure, PUT, close of ``uri`` as handle 1, request ids 1-3."""
    return [
        pb.ClientFrame(open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=uri, write=True)),
        pb.ClientFrame(puts=put_batch([1, 1], guids[:2], [b"a", b"b"])),
        pb.ClientFrame(
            configure_queue=pb.ConfigureQueue(
                request_id=2, queue_id=1, options=pb.QueueOptions(max_unconfirmed_messages=5)
            )
        ),
        pb.ClientFrame(puts=put_batch([1], guids[2:], [b"c"])),
        pb.ClientFrame(close_queue=pb.CloseQueue(request_id=3, queue_id=1)),
    ]


@pytest.mark.parametrize("together", [False, True], ids=["frame-by-frame", "one-message"])
def test_puts_and_a_configure_behind_an_unanswered_open_find_the_queue_open(
    world: World, together: bool
) -> None:
    uri = world.uri("pipelined")
    guids = [uuid.uuid4().bytes for _ in range(3)]
    with WireClient(world.address) as client:
        client.hello()
        frames = pipelined(uri, guids)
        if together:
            client.send(pb.ClientFrame(batch=pb.ClientFrames(frames=frames)))
        else:
            for frame in frames:
                client.send(frame)
        answers = [client.response(request_id).status for request_id in (1, 2, 3)]
        statuses = {ack.guid: ack.status for ack in client.acks(3)}
    assert answers == [pb.STATUS_OK] * 3
    assert statuses == dict.fromkeys(guids, pb.STATUS_OK)
    assert sorted(m.payload for m in wait_ready(world, uri, 3)) == [b"a", b"b", b"c"]


def test_puts_behind_an_open_that_fails_are_answered_like_puts_into_no_queue(
    world: World,
) -> None:
    uri = world.uri("refused-open")
    guid = uuid.uuid4().bytes
    with WireClient(world.address) as client:
        client.hello()
        # The same handle opened twice: the second open is refused, and a PUT behind
        # it goes into the first (still open) handle's queue, as on the broker.
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        client.send(
            pb.ClientFrame(open_queue=pb.OpenQueue(request_id=9, queue_id=1, uri=uri, write=True))
        )
        client.send(pb.ClientFrame(puts=put_batch([1], [guid], [b"x"])))
        assert client.response(9).status == pb.STATUS_ALREADY_OPEN
        assert [(a.guid, a.status) for a in client.acks(1)] == [(guid, pb.STATUS_OK)]
        # A handle whose open fails upstream: PUTs behind it get UNKNOWN_QUEUE.
        other = uuid.uuid4().bytes
        client.send(
            pb.ClientFrame(
                open_queue=pb.OpenQueue(request_id=10, queue_id=2, uri=uri + "?bad", write=True)
            )
        )
        client.send(pb.ClientFrame(puts=put_batch([2], [other], [b"y"])))
        assert client.response(10).status != pb.STATUS_OK
        assert [(a.guid, a.status) for a in client.acks(1)] == [(other, pb.STATUS_UNKNOWN_QUEUE)]


def test_a_close_behind_an_unanswered_open_comes_after_its_answer(world: World) -> None:
    """Open as handle 1, close it, open handle 1 on another queue and PUT, all without
    waiting: each request is answered, in order, and the PUT goes to the second queue.
    Through the proxy the first open was never answered (its close overtook it)."""
    first, second = world.uri("closed-early"), world.uri("reopened")
    guid = uuid.uuid4().bytes
    with WireClient(world.address) as client:
        client.hello()
        for frame in (
            pb.ClientFrame(
                open_queue=pb.OpenQueue(request_id=1, queue_id=1, uri=first, write=True)
            ),
            pb.ClientFrame(close_queue=pb.CloseQueue(request_id=2, queue_id=1)),
            pb.ClientFrame(
                open_queue=pb.OpenQueue(request_id=3, queue_id=1, uri=second, write=True)
            ),
            pb.ClientFrame(puts=put_batch([1], [guid], [b"x"])),
        ):
            client.send(frame)
        order = [client.recv("response").response for _ in range(3)]
        acks = [(a.guid, a.status) for a in client.acks(1)]
    assert [(r.request_id, r.status) for r in order] == [(i, pb.STATUS_OK) for i in (1, 2, 3)]
    assert acks == [(guid, pb.STATUS_OK)]
    assert [m.payload for m in wait_ready(world, second, 1)] == [b"x"]

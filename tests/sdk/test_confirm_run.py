"""``SessionEngine.confirm_run``: the CONFIRMs of many deliveries of one queue, checked
once and queued as one item (the proxy settling a client's ConfirmBatch), encoded
into ConfirmBatch frames beside the PUTs around them."""

from __future__ import annotations

import pytest

from holdfast.proto.columns import read_confirms, read_puts
from holdfast.sdk.errors import ConfirmDroppedError, QueueNotOpenError
from holdfast.sdk.frames import encode
from holdfast.sdk.outbound import CONFIRM_SIZE, ConfirmItem, ConfirmRun, OutboundItem
from holdfast.sdk.putbuffer import PendingPut

from .fakes import Harness, reader

G = [bytes([i]) * 16 for i in range(8)]


def put(n: int) -> PendingPut:
    return (G[n], 1, b"p%d" % n, None, None, 0.0, 50)


def test_a_run_is_encoded_as_its_confirms_one_by_one_would_be() -> None:
    items: list[OutboundItem] = [
        put(0),
        ConfirmItem(3, G[7]),
        ConfirmRun(4, G[:5]),
        put(1),
        put(2),
        ConfirmRun(5, G[5:7]),
    ]
    frames = list(encode(items, 3 * CONFIRM_SIZE, 0.0))
    kinds = [frame.WhichOneof("frame") for frame, _ in frames]
    # A PUT batch and a CONFIRM batch fill side by side, each up to the frame size.
    assert kinds == ["confirms", "puts", "puts", "confirms", "puts", "confirms"]
    assert [list(read_puts(f.puts).guids) for f, _ in frames if f.HasField("puts")] == [
        [G[0]],
        [G[1]],
        [G[2]],
    ]
    confirms = [read_confirms(f.confirms) for f, _ in frames if f.HasField("confirms")]
    assert confirms == [
        [(3, G[7]), (4, G[0]), (4, G[1])],
        [(4, G[2]), (4, G[3]), (4, G[4])],
        [(5, G[5]), (5, G[6])],
    ]
    assert sum(nbytes for _, nbytes in frames) == 3 * 50 + 8 * CONFIRM_SIZE
    one_by_one: list[OutboundItem] = []
    for item in items:
        if isinstance(item, ConfirmRun):
            one_by_one += [ConfirmItem(item.queue_id, g) for g in item.guids]
        else:
            one_by_one.append(item)
    for size in (1, 2 * CONFIRM_SIZE, 3 * CONFIRM_SIZE, 1 << 20):
        assert list(encode(items, size, 0.0)) == list(encode(one_by_one, size, 0.0))


def test_confirm_run_queues_one_item_for_the_run() -> None:
    h = Harness(wire_pushes=True)
    queue_id = reader(h)
    h.engine.confirm_run(queue_id, G[:3], h.generation)
    assert h.engine.stats().messages_confirmed == 3
    confirms = [read_confirms(f.confirms) for f in h.sent_frames() if f.HasField("confirms")]
    assert confirms == [[(queue_id, g) for g in G[:3]]]


def test_confirm_run_is_refused_whole_as_each_confirm_would_be() -> None:
    h = Harness(wire_pushes=True)
    queue_id = reader(h)
    stale = h.generation
    with pytest.raises(QueueNotOpenError):
        h.engine.confirm_run(queue_id + 1, G[:2], stale)
    h.lose()
    with pytest.raises(ConfirmDroppedError, match="link is down"):
        h.engine.confirm_run(queue_id, G[:2], stale)
    h.establish()
    with pytest.raises(ConfirmDroppedError, match="delivered earlier"):
        h.engine.confirm_run(queue_id, G[:2], stale)
    assert h.engine.stats().messages_confirmed == 0
    assert not [f for f in h.sent_frames() if f.HasField("confirms")]

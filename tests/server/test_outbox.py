"""The outbox on its own: the ordered lane, the push lane, coalescing and the read bound."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, NamedTuple

from holdfast.proto import pb
from holdfast.proto.columns import PushRow
from holdfast.server.outbox import MAX_PUSHES_PER_FRAME, AckGroup, Outbox
from tests.support.columns import acks_of, pushes_of


class Delivery(NamedTuple):
    """A pushable with no message object behind it."""

    guid: bytes
    payload: bytes
    properties: Mapping[str, str]


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


def g(name: bytes) -> bytes:
    """A 16-byte GUID named ``name`` (batches carry 16-byte GUIDs only)."""
    return name.ljust(16, b".")


def message(guid: bytes, size: int = 10) -> Delivery:
    return Delivery(g(guid), b"x" * size, {})


def response(request_id: int) -> pb.ServerFrame:
    return pb.ServerFrame(response=pb.Response(request_id=request_id, status=pb.STATUS_OK))


def test_outbox_keeps_the_ordered_lane_in_order_behind_pending_acks() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 20)
        first, second = AckGroup(), AckGroup()
        first.acks.append((1, g(b"g1"), pb.STATUS_OK))
        second.acks.append((1, g(b"g2"), pb.STATUS_OK))
        outbox.add_acks(first)
        outbox.add_acks(second)
        outbox.send(response(7))
        assert outbox.take() is None  # everything waits for the first group
        outbox.acks_ready(second)
        assert outbox.take() is None
        outbox.acks_ready(first)
        frame = outbox.take()
        assert frame is not None
        assert [a.guid for a in acks_of(frame.acks)] == [g(b"g1"), g(b"g2")]  # coalesced
        frame = outbox.take()
        assert frame is not None and frame.response.request_id == 7
        assert outbox.take() is None
        assert outbox.ordered_bytes == 0

    run(scenario())


def test_outbox_pushes_wait_for_an_open_response_and_alternate_with_acks() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 20)
        pending = AckGroup()
        pending.acks.append((2, g(b"g"), pb.STATUS_OK))
        outbox.add_acks(pending)
        outbox.send(response(1), holds_pushes=True)
        outbox.push(1, message(b"p1"), 1)
        assert outbox.take() is None  # the Response that opens handle 1 must go first
        outbox.acks_ready(pending)
        kinds = []
        while (frame := outbox.take()) is not None:
            kinds.append(frame.WhichOneof("frame"))
        assert kinds == ["acks", "response", "pushes"]
        # With both lanes busy, they take turns.
        for i in range(2):
            group = AckGroup()
            group.acks.append((1, g(b"g%d" % i), pb.STATUS_OK))
            outbox.add_acks(group)
            outbox.acks_ready(group)
            outbox.send(response(10 + i))
            outbox.push(1, message(b"q%d" % i), 1)
        kinds = []
        while (frame := outbox.take()) is not None:
            kinds.append(frame.WhichOneof("frame"))
        assert kinds == ["acks", "pushes", "response", "acks", "response"]

    run(scenario())


def test_outbox_ignores_an_empty_ack_group() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 20)
        empty = AckGroup()
        outbox.add_acks(empty)
        outbox.acks_ready(empty)
        outbox.send(response(3))
        frame = outbox.take()
        assert frame is not None and frame.WhichOneof("frame") == "response"
        assert outbox.take() is None

    run(scenario())


def test_outbox_splits_push_batches_at_the_frame_size() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=250, read_bound_bytes=1 << 20)
        for i in range(5):
            outbox.push(3, message(bytes([i]), size=100), 1)
        sizes = []
        while (frame := outbox.take()) is not None:
            sizes.append(len(pushes_of(frame.pushes)))
        assert sizes == [2, 2, 1]
        assert outbox.push_bytes == 0

    run(scenario())


def test_a_consumers_window_leaves_in_several_push_frames() -> None:
    # So the consumer confirms the head of its window while the rest is on its way.
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 30)
        for i in range(1000):
            outbox.push(3, message(i.to_bytes(2, "big"), size=100), 1)
        sizes = []
        while (frame := outbox.take()) is not None:
            sizes.append(len(pushes_of(frame.pushes)))
        assert sizes == [MAX_PUSHES_PER_FRAME] * 3 + [1000 - 3 * MAX_PUSHES_PER_FRAME]

    run(scenario())


def test_outbox_drops_pushes_of_a_closed_handle() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 20)
        outbox.push(1, message(b"a"), 1)
        outbox.push(2, message(b"b"), 1)
        outbox.drop_pushes(1)
        frame = outbox.take()
        assert frame is not None
        assert [(p.queue_id, p.guid) for p in pushes_of(frame.pushes)] == [(2, g(b"b"))]

    run(scenario())


def test_outbox_read_bound_closes_and_reopens_with_hysteresis() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=100)
        groups = []
        for i in range(6):  # 6 x (16 + 8) = 144 bytes > 100
            group = AckGroup()
            group.acks.append((1, bytes([i]) * 16, pb.STATUS_OK))
            groups.append(group)
            outbox.add_acks(group)
        assert not outbox.has_room
        outbox.acks_ready(groups[0])
        outbox.take()  # 120 bytes left: above the bound
        assert not outbox.has_room
        for group in groups[1:4]:
            outbox.acks_ready(group)
        outbox.take()  # 48 bytes left: under half the bound
        assert outbox.has_room
        await asyncio.wait_for(outbox.wait_for_room(), 1)

    run(scenario())


def test_a_relayed_push_is_written_with_the_handle_and_count_it_is_pushed_under() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_frame_bytes=1 << 20, read_bound_bytes=1 << 20)
        upstream = PushRow(b"g" * 16, b"body", {"k": "v"}, 2, 0)
        outbox.push(4, upstream, 3)
        outbox.push(4, message(b"h" * 16), 1)
        frame = outbox.take()
        assert frame is not None
        relayed, built = pushes_of(frame.pushes)
        assert (relayed.queue_id, relayed.guid, relayed.payload) == (4, b"g" * 16, b"body")
        assert (dict(relayed.properties), relayed.delivery_count) == ({"k": "v"}, 3)
        assert (built.queue_id, built.guid, built.delivery_count) == (4, b"h" * 16, 1)

    run(scenario())


def test_relayed_push_rows_leave_as_pushed_one_by_one_with_their_counts() -> None:
    async def scenario() -> None:
        rows = [PushRow(g(bytes([i])), b"x" * 100, {}, i + 1, 7) for i in range(5)]
        outbox = Outbox(max_frame_bytes=250, read_bound_bytes=1 << 20)
        outbox.push_rows(3, rows)
        outbox.push_rows(3, [])
        assert outbox.push_bytes == 5 * (100 + 32)
        frames = []
        while (frame := outbox.take()) is not None:
            frames.append(frame)
        one_by_one = Outbox(max_frame_bytes=250, read_bound_bytes=1 << 20)
        for row in rows:
            one_by_one.push(3, row, row.delivery_count)
        assert frames == [one_by_one.take() for _ in frames]
        assert [p.delivery_count for f in frames for p in pushes_of(f.pushes)] == [1, 2, 3, 4, 5]
        assert outbox.push_bytes == 0
        outbox.finishing = True
        outbox.push_rows(3, rows)
        assert outbox.take() is None and outbox.push_bytes == 0

    run(scenario())

"""The writers encode what they take a frame at a time: after an outage a proxy takes
its whole buffer (256 MiB by default) in one go, and frames made all at once, which
copy the payloads, doubled its memory while it still held the buffer (an outside
tester: 814 MiB of RSS at a 256 MiB bound, 16 KiB PUTs)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from holdfast.proto.columns import read_puts
from holdfast.sdk.frames import MAX_PUTS_PER_FRAME, encode
from holdfast.sdk.outbound import Outbound, OutboundItem
from holdfast.sdk.putbuffer import PendingPut


def backlog(count: int, taken: list[int]) -> Iterator[OutboundItem]:
    for i in range(count):
        taken[0] = i + 1
        put: PendingPut = (os.urandom(16), 1, b"x" * 100, None, None, 0.0, 140)
        yield put


def test_a_frame_leaves_before_the_rest_of_the_backlog_is_encoded() -> None:
    taken = [0]
    frames = encode(backlog(10 * MAX_PUTS_PER_FRAME, taken), 1 << 20, 1.0)
    frame, nbytes = next(frames)
    assert len(read_puts(frame.puts).guids) == MAX_PUTS_PER_FRAME and nbytes == 140 * 1024
    assert taken[0] <= MAX_PUTS_PER_FRAME + 1  # the next frame's first PUT at most
    rest = list(frames)
    assert len(rest) == 9 and taken[0] == 10 * MAX_PUTS_PER_FRAME


def test_a_take_is_let_go_of_as_it_is_encoded() -> None:
    """What ``Outbound.take`` hands over is emptied as frames are made: the list it was
    kept every sent payload (pinning its segment) until the whole backlog had left,
    and a proxy grew by what its clients posted meanwhile."""
    outbound = Outbound(1 << 30)
    for put in backlog(3 * MAX_PUTS_PER_FRAME, [0]):
        outbound.add(put, 140)
    taken = outbound.take()
    assert not outbound.items and outbound.transport_bytes == 3 * MAX_PUTS_PER_FRAME * 140
    frames = encode(taken, 1 << 20, 1.0)
    next(frames)
    assert len(taken) < 2 * MAX_PUTS_PER_FRAME
    assert len(list(frames)) == 2 and not taken

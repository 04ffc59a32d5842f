"""Several frames in one gRPC message (``ClientFrames`` / ``ServerFrames``), built from
frames already serialized.

A batch is the frame's ``batch`` field (number 11 in both ``ClientFrame`` and
``ServerFrame``) holding ``frames`` (field 1), so its bytes are the serialized frames,
each behind its tag and length, behind the outer tag and length: no frame is parsed
or copied into a new message to join them. A peer sends batches only to a peer that
announced ``accepts_batches`` in its Hello or HelloReply.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

_BATCH_TAG = bytes([11 << 3 | 2])  # field 11, length-delimited
_FRAME_TAG = bytes([1 << 3 | 2])  # field 1, length-delimited

BATCH_OVERHEAD = 12
"""Bytes a batch adds at most: its outer tag and length (up to 6 bytes for a 4 GiB
message), and a frame's own tag and length besides the first frame's."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def pack(frames: list[bytes]) -> bytes:
    """One serialized frame whose ``batch`` holds ``frames`` (serialized frames of the
    same kind, ClientFrame or ServerFrame), in order."""
    inner = b"".join(_FRAME_TAG + _varint(len(frame)) + frame for frame in frames)
    return _BATCH_TAG + _varint(len(inner)) + inner


def packed(frames: Iterable[tuple[bytes, int]], max_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Join consecutive serialized frames (each with the bytes it accounts for) into
    batches of at most ``max_bytes``; a frame alone is passed on as it is."""
    group: list[bytes] = []
    accounted = 0
    size = 0
    for frame, nbytes in frames:
        cost = len(frame) + BATCH_OVERHEAD
        if group and size + cost > max_bytes:
            yield (group[0] if len(group) == 1 else pack(group)), accounted
            group, accounted, size = [], 0, 0
        group.append(frame)
        accounted += nbytes
        size += cost
    if group:
        yield (group[0] if len(group) == 1 else pack(group)), accounted

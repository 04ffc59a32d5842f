"""A proxy's retransmit, read out of the PUT buffer as it is sent.

After an outage a proxy retransmits its whole buffer (256 MiB by default) in one
restore. Queued PUT by PUT, each pending PUT became a tuple with its GUID, a view of its
payload and its post time: ~520 B of RSS a PUT, 78 MiB at the bound with 1 KiB PUTs,
all made before the first frame left (``bench/proxy_memory.py``). A ``ResendRun`` is
one outbound item that stands for those PUTs: the segments and how far into each the
buffer reached at the restore; the encoder reads the PUTs out of them one at a time as
it fills each frame (``frames.encode``), so only the frame being made holds any.

Only where the encoder runs on the engine's own thread: the proxy's upstream, an
asyncio driver, whose buffer is keyed (``PutBuffer.keyed``). A threaded SDK encodes on
its writer thread while its engine thread reports PUTs, and a reported stray's GUID is
taken out of its segment; it queues tuples as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from holdfast.sdk.putbuffer import PUT_OVERHEAD, SIZE, PendingPut, PutBuffer, pending_put
from holdfast.sdk.segment import Segment

if TYPE_CHECKING:  # outbound.py imports this module: a run is one of its items
    from holdfast.sdk.outbound import Outbound


class ResendRun:
    """PUTs of the buffer to send again, in post order, read out as they are encoded.

    ``spans``: each segment with its length at the restore (PUTs posted later are queued
    on their own, after this run); ``skip``: queues whose PUTs are not sent (closing);
    ``total``: the bytes the run was queued for. A PUT reported between the restore and
    its encoding is not sent, and the bytes it was counted for are given back to
    ``outbound`` when the run is spent, as if sent (``Outbound.drained``)."""

    __slots__ = ("_skip", "_spans", "outbound", "total")

    def __init__(
        self,
        spans: list[tuple[Segment, int]],
        skip: frozenset[int],
        total: int,
        outbound: Outbound,
    ) -> None:
        self._spans = spans
        self._skip = skip
        self.total = total
        self.outbound = outbound

    def __iter__(self) -> Iterator[PendingPut]:
        sent = 0
        skip, spans = self._skip, self._spans
        spans.reverse()
        while spans:
            # Popped, not walked: a segment whose PUTs were all sent and ACKed is
            # dropped by the buffer, and must not be kept here until the run ends.
            segment, end = spans.pop()
            live, queue_ids = segment.live, segment.queue_ids
            for i in range(end):
                if live[i] and queue_ids[i] not in skip:
                    put = pending_put(segment, i)
                    sent += put[SIZE]
                    yield put
            del segment, live, queue_ids
        if self.total > sent:
            self.outbound.drained(self.total - sent)


def spans_to_resend(
    puts: PutBuffer, horizon: float, skip: frozenset[int]
) -> tuple[list[tuple[Segment, int]], list[PendingPut], int, int]:
    """Walk the buffer once, making no tuple for a PUT that is sent again: the segments
    to resend from (with their lengths now), the PUTs past ``horizon`` (to report
    UNKNOWN), and how many PUTs will be resent and for how many bytes."""
    spans: list[tuple[Segment, int]] = []
    expired: list[PendingPut] = []
    count = total = 0
    for segment in list(puts.segments.order):
        live, posted, queue_ids = segment.live, segment.posted, segment.queue_ids
        resent = 0
        for i in range(len(segment)):
            if not live[i]:
                continue
            if posted[i] <= horizon:
                expired.append(pending_put(segment, i))
            elif queue_ids[i] not in skip:
                total += segment.size(i) + PUT_OVERHEAD
                resent += 1
        if resent:
            spans.append((segment, len(segment)))
            count += resent
    return spans, expired, count, total


__all__ = ["ResendRun", "spans_to_resend"]

"""Encoding the engine's outbound items into batched wire frames.

Consecutive PUTs share one columnar ``PutBatch`` frame and consecutive CONFIRMs one
``ConfirmBatch`` frame, up to ``max_batch_bytes`` each; REJECTs (rare) and requests
travel in their
own frames and keep their place in the order, so a PUT posted before a close
still reaches the broker before that close.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import repeat

from holdfast.proto import pb
from holdfast.proto.columns import confirm_batch, put_batch, reject_batch
from holdfast.sdk.outbound import (
    CONFIRM_SIZE,
    FRAME_SIZE,
    ConfirmItem,
    ConfirmRun,
    OutboundItem,
    RejectItem,
)
from holdfast.sdk.putbuffer import GUID, PAYLOAD, POSTED_AT, PROPERTIES, QUEUE_ID, SIZE, PendingPut
from holdfast.sdk.resend import ResendRun

MAX_PUTS_PER_FRAME = 1024
"""Most PUTs in one PutBatch. After a reconnect the whole backlog is retransmitted at
once; in 1 MiB frames (about 6000 100-byte PUTs after a 1 s outage at 5k msg/s) the
broker stores and ACKs it as one block, so the first ACK came 0.10-0.18 s after the
restore; in frames of 1024 it comes after 0.06-0.14 s (4 runs of
``bench/recovery.py``). Steady PUT->ACK throughput was the same within run-to-run
noise (112-129k direct, 88-91k through the proxy)."""


_Encodable = PendingPut | ConfirmItem | ConfirmRun | RejectItem | pb.ClientFrame


def _draining(items: deque[OutboundItem]) -> Iterator[_Encodable]:
    """Pop each item as it is encoded; a ``ResendRun`` gives its PUTs one by one."""
    popleft = items.popleft
    while items:
        item = popleft()
        if item.__class__ is ResendRun:
            yield from item
        else:
            yield item  # type: ignore[misc]


def _expanding(items: Iterable[OutboundItem]) -> Iterator[_Encodable]:
    for item in items:
        if isinstance(item, ResendRun):
            yield from item
        else:
            yield item


def encode(
    items: Iterable[OutboundItem], max_batch_bytes: int, now: float
) -> Iterator[tuple[pb.ClientFrame, int]]:
    """Turn outbound items into frames, each with the bytes it accounts for, one at a
    time as each is complete.

    Each PUT carries its age at ``now`` (``Put.age_ms``): how long ago it was first
    posted, so the next hop continues its age instead of starting it again.

    The writers send each frame before the next is made: after an outage a proxy
    retransmits its whole buffer (256 MiB by default) in one take, and frames made all
    at once, which copy the payloads, doubled its memory while it still held the
    buffer. A ``deque`` (what ``Outbound.take`` gives) is emptied as it is encoded, so a
    long take holds no payload it has sent.
    """
    frames: list[tuple[pb.ClientFrame, int]] = []  # complete, not yet yielded
    # Taken from ``Outbound`` (a deque): let go of each as it goes.
    encodable = _draining(items) if isinstance(items, deque) else _expanding(items)
    # The open PUT batch, as columns (``holdfast.proto.columns``).
    queue_ids: list[int] = []
    guids: list[bytes] = []
    payloads: list[bytes | memoryview] = []
    ages: list[int] = []
    properties: list[tuple[int, Mapping[str, str]]] = []
    put_bytes = 0
    confirm_ids: list[int] = []
    confirm_guids: list[bytes] = []
    confirm_bytes = 0

    def flush_puts() -> None:
        nonlocal queue_ids, guids, payloads, ages, properties, put_bytes
        if guids:
            batch = put_batch(queue_ids, guids, payloads, ages, properties)
            frames.append((pb.ClientFrame(puts=batch), put_bytes))
            queue_ids, guids, payloads, ages, properties, put_bytes = [], [], [], [], [], 0

    def flush_confirms() -> None:
        nonlocal confirm_ids, confirm_guids, confirm_bytes
        if confirm_guids:
            batch = confirm_batch(confirm_ids, confirm_guids)
            frames.append((pb.ClientFrame(confirms=batch), confirm_bytes))
            confirm_ids, confirm_guids, confirm_bytes = [], [], 0

    for item in encodable:
        if isinstance(item, tuple):  # a PendingPut (see its note on why it is a tuple)
            size = item[SIZE]
            if guids and (put_bytes + size > max_batch_bytes or len(guids) >= MAX_PUTS_PER_FRAME):
                flush_puts()
            age_ms = int((now - item[POSTED_AT]) * 1000.0)
            if item[PROPERTIES]:
                properties.append((len(guids), item[PROPERTIES]))
            queue_ids.append(item[QUEUE_ID])
            guids.append(item[GUID])
            payloads.append(item[PAYLOAD])
            ages.append(age_ms if age_ms > 0 else 0)
            put_bytes += size
        elif isinstance(item, ConfirmItem):
            if confirm_guids and confirm_bytes + CONFIRM_SIZE > max_batch_bytes:
                flush_confirms()
            confirm_ids.append(item.queue_id)
            confirm_guids.append(item.guid)
            confirm_bytes += CONFIRM_SIZE
        elif isinstance(item, ConfirmRun):
            run = item.guids  # not ``guids``: that is the open PUT batch's column
            start = 0
            while start < len(run):
                if confirm_guids and confirm_bytes + CONFIRM_SIZE > max_batch_bytes:
                    flush_confirms()
                room = max(1, (max_batch_bytes - confirm_bytes) // CONFIRM_SIZE)
                taken = run[start : start + room]
                confirm_ids += repeat(item.queue_id, len(taken))
                confirm_guids += taken
                confirm_bytes += CONFIRM_SIZE * len(taken)
                start += len(taken)
        elif isinstance(item, RejectItem):
            flush_puts()
            flush_confirms()
            reject = reject_batch([(item.queue_id, item.guid, item.requeue, item.delay_ms)])
            frames.append((pb.ClientFrame(rejects=reject), CONFIRM_SIZE))
        else:
            flush_puts()
            flush_confirms()
            frames.append((item, FRAME_SIZE))
        if frames:
            yield from frames
            frames.clear()
    flush_puts()
    flush_confirms()
    yield from frames

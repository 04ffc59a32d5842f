"""Columnar batches as rows, for tests that look at one ACK, PUSH or PUT at a time.

The wire carries batches as columns (``holdfast.proto.columns``); a test that checks
the third ACK's status reads ``acks_of(batch)[2].status``, and a test that sends a
hand-made batch builds it from rows with ``ack_batch_of`` and friends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from holdfast.proto import pb
from holdfast.proto.columns import (
    PutRow,
    ack_batch,
    push_batch,
    put_batch,
    read_acks,
    read_confirms,
    read_pushes,
    read_puts,
    read_rejects,
)


class AckView(NamedTuple):
    """One ACK of a batch."""

    queue_id: int
    guid: bytes
    status: pb.Status


class PushView(NamedTuple):
    """One PUSH of a batch."""

    queue_id: int
    guid: bytes
    payload: bytes
    properties: Mapping[str, str] = {}
    delivery_count: int = 1
    age_ms: int = 0


class ConfirmView(NamedTuple):
    """One CONFIRM of a batch."""

    queue_id: int
    guid: bytes


class RejectView(NamedTuple):
    """One REJECT of a batch."""

    queue_id: int
    guid: bytes
    requeue: bool
    delay_ms: int


def acks_of(batch: pb.AckBatch) -> list[AckView]:
    """The ACKs of ``batch``, in order."""
    return [AckView(q, g, s) for q, g, s in read_acks(batch)]


def pushes_of(batch: pb.PushBatch) -> list[PushView]:
    """The PUSHes of ``batch``, in order."""
    return [PushView(q, *row) for q, row in read_pushes(batch)]


def puts_of(batch: pb.PutBatch) -> list[PutRow]:
    """The PUTs of ``batch``, in order."""
    return list(read_puts(batch).rows())


def confirms_of(batch: pb.ConfirmBatch) -> list[ConfirmView]:
    """The CONFIRMs of ``batch``, in order."""
    return [ConfirmView(q, g) for q, g in read_confirms(batch)]


def rejects_of(batch: pb.RejectBatch) -> list[RejectView]:
    """The REJECTs of ``batch``, in order."""
    return [RejectView(*row) for row in read_rejects(batch)]


def ack_batch_of(acks: Sequence[tuple[int, bytes, pb.Status]]) -> pb.AckBatch:
    """An AckBatch of (queue_id, guid, status) rows."""
    return ack_batch(acks)


def push_batch_of(pushes: Sequence[PushView]) -> pb.PushBatch:
    """A PushBatch of rows."""
    return push_batch(
        [p.queue_id for p in pushes],
        [p.guid for p in pushes],
        [p.payload for p in pushes],
        [p.delivery_count for p in pushes],
        [p.age_ms for p in pushes],
        [(i, p.properties) for i, p in enumerate(pushes) if p.properties],
    )


def put_batch_of(puts: Sequence[PutRow]) -> pb.PutBatch:
    """A PutBatch of rows."""
    return put_batch(
        [p.queue_id for p in puts],
        [p.guid for p in puts],
        [p.payload for p in puts],
        [p.age_ms for p in puts],
        [(i, p.properties) for i, p in enumerate(puts) if p.properties],
    )

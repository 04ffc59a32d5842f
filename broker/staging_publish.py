"""Publishing a transactional commit's rows: one PutBatch through the broker's own PUT
path (``holdfast.broker.staging_service`` decides what to publish; this puts it)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from holdfast.broker.consumers import QueueHandle
from holdfast.broker.puts import PutPipeline
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.staging import StagedRow
from holdfast.broker.store import CommitRecord
from holdfast.broker.writer import Writer
from holdfast.proto import pb
from holdfast.proto.columns import PutColumns
from holdfast.server.outbox import AckGroup, Outbox

_QUEUE_ID = 1
"""The handle the publishing PutBatch uses (a handle of its own, not a session's)."""


class _AckCollector(Outbox):
    """Receives the ACKs of one publishing PutBatch and says when they are final."""

    def __init__(self) -> None:
        super().__init__(1 << 20, 1 << 30)
        self.group: AckGroup | None = None
        self.done = asyncio.Event()

    def add_acks(self, group: AckGroup) -> None:
        self.group = group
        if group.ready:
            self.done.set()

    def acks_ready(self, group: AckGroup) -> None:
        group.ready = True
        self.done.set()


async def publish_staged(
    queues: QueueRegistry,
    puts: PutPipeline,
    writer: Writer,
    uri: str,
    rows: Sequence[StagedRow],
    record: CommitRecord,
) -> pb.StagingReply | None:
    """Put ``rows`` into ``uri`` as one PutBatch whose store write carries ``record``;
    None once every row is ACKed OK, else the refusal to answer."""
    if not rows:
        return None
    queue = queues.open(uri)
    handle = QueueHandle(_QUEUE_ID, queue, read=False, write=True, consumer=None)
    batch = PutColumns(
        [_QUEUE_ID] * len(rows),
        [row.guid for row in rows],
        [row.payload for row in rows],
        [0] * len(rows),
        {i: dict(row.properties) for i, row in enumerate(rows) if row.properties},
    )
    collector = _AckCollector()
    queue.handles += 1  # not dropped as idle while it is being written
    try:
        # A row in flight would wait on a write the record cannot join (and that may
        # fail): let such writes settle first, so the record goes with the batch.
        await puts.quiet(queue, batch.guids)
        puts.on_put_batch(batch, {_QUEUE_ID: handle}, collector, writer, None, record)
        await collector.done.wait()
    finally:
        queue.handles -= 1
    assert collector.group is not None
    failed: dict[str, int] = {}
    for _, _, status in collector.group.acks:
        if status != pb.STATUS_OK:
            name = pb.Status.Name(status)
            failed[name] = failed.get(name, 0) + 1
    if not failed:
        return None
    worst: pb.Status = (
        pb.STATUS_CONFLICT if "STATUS_CONFLICT" in failed else pb.Status.Value(next(iter(failed)))  # type: ignore[assignment]
    )
    return pb.StagingReply(
        status=worst,
        message=f"publishing {len(batch)} staged rows to {uri}: {failed}; the commit can "
        "be tried again (rows already in the queue are recognised by GUID)",
    )

"""Accepting a PUT frame whose PUTs go to many queues (``broker.accept``): a frame posted
round-robin over open queues takes another path than a frame of one queue, and must
keep the same rules — each message in its queue, in post order, once, remembered by
its queue's history so that a replay is a duplicate."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from holdfast.broker.consumers import QueueHandle
from holdfast.broker.puts import PutPipeline
from holdfast.broker.queues import Queue
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.store import MemoryStore
from holdfast.proto import pb
from holdfast.proto.columns import PutColumns
from holdfast.proto.limits import Limits


class _Outbox:
    """Keeps the ACK groups the pipeline hands over."""

    def __init__(self) -> None:
        self.groups: list[Any] = []

    def add_acks(self, group: Any) -> None:
        self.groups.append(group)

    def acks_ready(self, group: Any) -> None:
        pass


def _frame(queue_ids: list[int], guids: list[bytes]) -> PutColumns:
    payloads = [b"p-" + guid for guid in guids]
    return PutColumns(queue_ids, guids, payloads, [0] * len(guids), {})


async def _accept_twice(
    queue_ids: list[int],
) -> tuple[dict[int, Queue], list[Any], list[bytes]]:
    """Accept a frame of new PUTs to ``queue_ids``, then the same frame again; the
    queues by id, the ACK groups and the GUIDs."""
    store = MemoryStore()
    registry = QueueRegistry(store)
    pipeline = PutPipeline(store, registry, Limits())
    handles = {
        queue_id: QueueHandle(
            queue_id, registry.open(f"hf://accept/q{queue_id}"), False, True, None
        )
        for queue_id in set(queue_ids)
    }
    guids = [uuid.uuid4().bytes for _ in queue_ids]
    outbox = _Outbox()
    pipeline.on_put_batch(_frame(queue_ids, guids), handles, outbox, writer=None)  # type: ignore[arg-type]
    await pipeline.drain()
    # The same frame again: every PUT is a replay.
    pipeline.on_put_batch(_frame(queue_ids, guids), handles, outbox, writer=None)  # type: ignore[arg-type]
    await pipeline.drain()
    return {queue_id: handle.queue for queue_id, handle in handles.items()}, outbox.groups, guids


def test_a_frame_over_many_queues_puts_each_message_in_its_queue_once_in_order() -> None:
    queue_ids = [index % 7 for index in range(70)]
    queues, groups, guids = asyncio.run(_accept_twice(queue_ids))
    for queue_id, queue in queues.items():
        mine = [guid for guid, owner in zip(guids, queue_ids, strict=True) if owner == queue_id]
        assert [message.guid for message in queue.ready] == mine
        assert [message.payload for message in queue.ready] == [b"p-" + guid for guid in mine]
        assert all(queue.history.get(guid) is not None for guid in mine)
        assert queue.accepted == len(mine)
        assert queue.dedup_hits == len(mine)
        assert not queue.in_flight and queue.in_flight_bytes == 0
    for group in groups:
        assert [status for _, _, status in group.acks] == [pb.STATUS_OK] * 70


def test_a_frame_of_one_queue_and_a_mixed_one_leave_the_same_queue() -> None:
    one, _, one_guids = asyncio.run(_accept_twice([1] * 30))
    mixed, _, mixed_guids = asyncio.run(_accept_twice([1, 2] * 15))
    assert len(one[1].ready) == 30 and one[1].dedup_hits == 30
    assert len(mixed[1].ready) == len(mixed[2].ready) == 15
    assert mixed[1].live_bytes == sum(len(b"p-" + guid) for guid in mixed_guids[::2])
    assert one[1].live_bytes == sum(len(b"p-" + guid) for guid in one_guids)

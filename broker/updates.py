"""Confirmations, delivery counts and forgotten commit records on their way to the store.

A PUSH leaves only once the store has made its new delivery count durable, so a
redelivery after a crash, even a kill -9, always counts higher than every delivery
before it. With the memory store that costs nothing (its writes are done at once);
with SQLite a PUSH waits for the next group commit. ``Updates`` gathers the changes
of one turn of the event loop into one store batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from itertools import repeat
from typing import TYPE_CHECKING

from holdfast.broker.store import (
    CommitRecord,
    Completed,
    DeliveryUpdate,
    MemoryStore,
    MessageKey,
    Store,
    StoreBatch,
    StoredMessage,
    settle,
)
from holdfast.server import spans

if TYPE_CHECKING:
    from holdfast.broker.consumers import Consumer

log = logging.getLogger(__name__)

PendingPush = tuple["Consumer", StoredMessage, int]
"""A PUSH waiting for its delivery count to be durable: (consumer, message, count)."""


class Updates:
    """Confirmations and delivery-count changes, gathered during one turn of the event
    loop and handed to the store as one batch at the end of it. The PUSHes carrying
    the new counts leave once that batch is durable."""

    def __init__(self, store: Store) -> None:
        self._store = store
        # A store whose write is the memory store's (it keeps nothing) needs no records
        # of removals and delivery counts: building them was a tenth of the broker's
        # work per PUSH->CONFIRM message. A store that writes, even a subclass, gets them.
        self._records = getattr(type(store), "write", None) is not MemoryStore.write
        self._batch = StoreBatch()
        self._pushes: list[PendingPush] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._since: int | None = None
        """When the first delivery of this batch was decided (ns), for deliver spans."""

    def removed(self, queue_uri: str, guid: bytes) -> None:
        """``guid`` was confirmed and left ``queue_uri``."""
        if self._records:
            self._batch.removed.append(MessageKey(queue_uri, guid))
            self._schedule()

    def removed_run(self, queue_uri: str, guids: list[bytes]) -> None:
        """``removed`` for each of ``guids`` (a run of CONFIRMs of one queue)."""
        if self._records:
            self._batch.removed.extend(map(MessageKey, repeat(queue_uri), guids))
            self._schedule()

    def delivered(self, queue_uri: str, pushes: list[PendingPush]) -> None:
        """Messages of ``queue_uri`` were handed to consumers and their delivery counts
        changed; their PUSHes leave once the counts are durable."""
        if self._records:
            self._batch.delivered.extend(
                [DeliveryUpdate(queue_uri, message.guid, count) for _, message, count in pushes]
            )
        self._pushes.extend(pushes)
        if self._since is None:
            self._since = time.time_ns()
        self._schedule()

    def forget_commit(self, record: CommitRecord) -> None:
        """``record``'s commit mark is durable: the store may delete the record. Not
        waited for: a record left by a crash is completed again at start, a no-op."""
        self._batch.forgotten.append(record)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what was gathered to the store now, without waiting for it."""
        self._scheduled = False
        batch, self._batch = self._batch, StoreBatch()
        pushes, self._pushes = self._pushes, []
        since, self._since = self._since, None
        if batch:
            result = self._store.write(batch)
            if not isinstance(result, Completed):
                task = asyncio.get_running_loop().create_task(
                    self._settle(result, batch, pushes, since)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
        _send(pushes, since)

    async def _settle(
        self,
        result: Awaitable[None],
        batch: StoreBatch,
        pushes: list[PendingPush],
        since: int | None,
    ) -> None:
        try:
            await settle(result)
        except Exception:
            # Not fatal: a confirmed message may come back after a restart, and a count
            # not made durable may repeat after one (logged; delivery matters more).
            log.exception(
                "the store failed to record %d confirmations, %d delivery counts and %d "
                "forgotten commit records",
                len(batch.removed),
                len(batch.delivered),
                len(batch.forgotten),
            )
        _send(pushes, since)

    async def drain(self) -> None:
        """Flush and wait until every batch handed over has settled."""
        self.flush()
        while self._tasks:
            await asyncio.wait(list(self._tasks))


def _send(pushes: list[PendingPush], since: int | None) -> None:
    """PUSH what is still the consumer's under the same count (a consumer that left
    meanwhile gave its messages back; their next delivery counts higher)."""
    sent: list[tuple[StoredMessage, int]] | None = [] if spans.active() else None
    for consumer, message, count in pushes:
        if consumer.unconfirmed.get(message.guid) is message and message.delivery_count == count:
            consumer.sink.push(consumer.queue_id, message, count)
            if sent is not None:
                sent.append((message, count))
    if sent:
        spans.delivered(sent, since)


__all__ = ["PendingPush", "Updates"]

"""The admin service's work on the memory and sqlite stores (``admin.AdminBackend``):
the broker's own queues, and the store that makes each change durable before the
reply says OK (an operator who saw OK can restart the broker and find it)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from holdfast.broker.admin import peeked
from holdfast.broker.queues import Queue
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.store import Store, StoreBatch
from holdfast.proto import pb
from holdfast.proto.policy import QueuePolicy
from holdfast.proto.validate import Invalid

log = logging.getLogger(__name__)


class LocalAdmin:
    """``AdminBackend`` over one broker's ``QueueRegistry`` and store."""

    def __init__(self, queues: QueueRegistry, store: Store, clock: Callable[[], float]) -> None:
        self._queues = queues
        self._store = store
        self._clock = clock

    async def list_queues(self) -> list[pb.QueueStats]:
        """Every queue the broker holds now, sorted by URI."""
        return [self._stats(q) for q in sorted(self._queues, key=lambda queue: queue.uri)]

    async def stats(self, uri: str) -> pb.QueueStats:
        """One queue's depth, consumers, counters and policy."""
        return self._stats(self._find(uri))

    async def peek(self, uri: str, count: int, skip: int = 0) -> list[pb.PeekedMessage]:
        """``count`` ready messages after the first ``skip``, in delivery order, left in
        place."""
        now = self._clock()
        ready = self._find(uri).ready
        return [peeked(m, now) for m in itertools.islice(ready, skip, skip + count)]

    async def purge(self, uri: str) -> int:
        """Remove the ready and delayed messages; consumers keep their unconfirmed ones."""
        count, batch = self._queues.purge(uri)
        await self._write(batch)
        return count

    async def delete(self, uri: str) -> int:
        """Delete an unused queue with its messages, history and policy."""
        count, batch = self._queues.delete(uri)
        await self._write(batch)
        return count

    async def set_policy(self, uri: str, policy: QueuePolicy) -> None:
        """Replace the policy of a queue or template, durably."""
        await self._write(self._queues.set_policy(uri, policy))

    async def get_policy(self, uri: str) -> QueuePolicy:
        """The policy in force at a queue (its own or its template's) or a template."""
        policy = self._queues.policy_of(uri)
        if policy is None:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue or template {uri} on this broker")
        return policy

    async def replay(self, uri: str, may_write: Callable[[str], bool]) -> tuple[int, list[str]]:
        """Move every ready message of a dead-letter queue back to its original queue
        (the removal and the copy commit together), if ``may_write`` its domain."""
        queue = self._find(uri)
        moving, problems = self._queues.graveyard.replay(queue, may_write)
        await self._queues.graveyard.wait()
        # A move the store refused put its messages back (logged): not counted.
        moved = [message for message in moving if message.guid not in queue.live]
        if len(moved) < len(moving):
            raise Invalid(
                pb.STATUS_STORE_ERROR,
                f"the store failed to move {len(moving) - len(moved)} of {len(moving)} "
                "messages; they stay in the dead-letter queue (see the broker's log)",
            )
        return len(moving), problems

    def _find(self, uri: str) -> Queue:
        queue = self._queues.get(uri)
        if queue is None:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue {uri} on this broker")
        return queue

    async def _write(self, batch: StoreBatch) -> None:
        try:
            await self._store.write(batch)
        except Exception as error:
            log.exception("admin: the store failed to record a change")
            raise Invalid(pb.STATUS_STORE_ERROR, f"the store failed: {error}") from error

    def _stats(self, queue: Queue) -> pb.QueueStats:
        oldest = queue.oldest_accepted_at()
        return pb.QueueStats(
            uri=queue.uri,
            ready=len(queue.ready) + len(queue.delayed),
            unconfirmed=queue.unconfirmed,
            bytes=queue.live_bytes,
            consumers=len(queue.consumers),
            handles=queue.handles,
            oldest_age_seconds=0.0 if oldest is None else max(0.0, self._clock() - oldest),
            accepted=queue.accepted,
            redelivered=queue.redelivered,
            rejected=queue.rejected,
            dead_lettered=sum(queue.dead.values()),
            expired=queue.dead["expired"],
            policy=queue.policy.to_wire(),
        )


__all__ = ["LocalAdmin"]

"""This node's view of the queues on the Redis store, and the background work they
need: batched confirms, requeues, the queue list, consumer and handle counts and
wake-ups (the session code sees the same interface as ``broker.registry``:
``broker.interfaces``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from holdfast.broker.consumers import Consumer
from holdfast.broker.redis import policy_scripts, scripts
from holdfast.broker.redis.client import FencedError, RedisClient
from holdfast.broker.redis.confirming import UnrecordedConfirms
from holdfast.broker.redis.graveyard import RedisGraveyard
from holdfast.broker.redis.keys import QUEUES, WAKE, QueueKeys, lease_key, node_queues
from holdfast.broker.redis.losses import RecentWork, SeqBook
from holdfast.broker.redis.owed import OwedWrites
from holdfast.broker.redis.policies import PolicyBook, ttl_cutoff_ms
from holdfast.broker.redis.queues import RedisQueue, parse_message
from holdfast.broker.redis.script import rows, text
from holdfast.broker.redis.scripts import Claimed
from holdfast.broker.redis.takes import SETTLING, TakeTokens
from holdfast.broker.store import StoreError

log = logging.getLogger(__name__)


LIST_BATCH = 10_000
"""Most queues one SADD lists."""


class RedisRegistry:
    """This node's view of the queues, and the background work they need."""

    def __init__(
        self,
        client: RedisClient,
        node_id: str,
        now_ms: Callable[[], int],
        retention_ms: int = 600_000,
    ) -> None:
        self.client = client
        self.node_id = node_id
        """The incarnation this node delivers under (``lease``): its id and fencing
        token, replaced when the node rejoins after its lease lapsed."""
        self.takes = TakeTokens()
        """The tokens of this node's CLAIMs, EXPIREs and SETTLEs (``takes``)."""
        self.owed = OwedWrites()
        """Give-backs and confirms Redis did not take, written by the sweep (``owed``)."""
        self.unrecorded = UnrecordedConfirms()
        """Confirms not recorded in Redis yet, voided if the lease lapses (``confirming``)."""
        self.may_deliver: Callable[[], bool] = lambda: True
        """Whether the node's lease is valid now (its own timer: ``LeaseKeeper.valid``);
        nothing is claimed while it is not."""
        self.now_ms = now_ms
        self.policies = PolicyBook(client)
        """Every queue's policy (``policies``)."""
        self.graveyard = RedisGraveyard(self, retention_ms)
        """Moves dead messages to dead-letter queues, and back (``graveyard``)."""
        self.on_went_back: Callable[[], Awaitable[None]] | None = None
        """The node's loss check (``losscheck``), for a claim that finds Redis went back."""
        self.repairing: set[str] = set()
        """Queues found to have gone back, until the node re-applied its work there."""
        self.recent = RecentWork()
        """Deliveries and confirms to re-apply if Redis goes back in time (``losses``)."""
        self.seqs = SeqBook(time.monotonic)
        """The write sequences this node's scripts returned (``losses``)."""
        self.unsynced: set[str] = set()
        """Queues holding messages not yet on enough replicas (``durable``)."""
        self.timed: dict[str, int] = {}
        """Queues this node delayed a reject or PUT a pickup TTL in -> the latest due
        time it knows of (ms): the sweep visits them often until then."""
        self._queues: dict[str, RedisQueue] = {}
        self._confirms: dict[str, list[bytes]] = {}
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._remembered: set[str] = set()
        self._listed: set[str] = set()
        self._to_list: dict[str, asyncio.Future[None]] = {}
        self.budget = None
        self.dropped_idle = 0

    def lease(self, keys: QueueKeys) -> str:
        """The lease key the delivery scripts of ``keys``'s queue check (``FENCE``). On
        Redis Cluster a script may not read another slot: a key of the queue's own slot
        that is no lease stands in, and the node's timer alone fences."""
        if self.client.spec.cluster:
            return keys.prefix + "unleased"
        return lease_key(self.node_id)

    def revoke(self) -> int:
        """The lease lapsed: every delivery of this node's consumers is void (a peer may
        reclaim it soon). Each session is told which (``DELIVERIES_REVOKED``); their
        CONFIRMs are refused from now on. Returns how many deliveries."""
        revoked = 0
        for queue in self:
            for consumer in queue.consumers:
                guids = list(consumer.unconfirmed)
                consumer.unconfirmed.clear()
                consumer.unconfirmed_bytes = 0
                if guids:
                    consumer.sink.revoke(consumer.queue_id, guids)
                    revoked += len(guids)
        return revoked + self.unrecorded.void()

    def rejoined(self, incarnation: str) -> None:
        """The node holds a lease again, under ``incarnation``: what it delivers from now
        on is kept under it, and its counts are published under it."""
        self.node_id = incarnation
        self._remembered.clear()
        self._confirms.clear()  # confirms of void deliveries: refused anyway
        for queue in self:
            self.consumers_changed(queue)
            self.handles_changed(queue)
            queue.deliver()

    def now(self) -> float:
        """Seconds on the shared clock ``accepted_at`` times are on (Redis: wall ms)."""
        return self.now_ms() / 1000

    def __iter__(self) -> Iterator[RedisQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, uri: str) -> RedisQueue | None:
        """The queue at ``uri`` if this node has it open."""
        return self._queues.get(uri)

    def open(self, uri: str) -> RedisQueue:
        """The queue at ``uri``, listed in ``hf:queues`` (queues are created on use)."""
        queue = self._queues.get(uri)
        if queue is None:
            queue = self._queues[uri] = RedisQueue(uri, self)
            self.spawn(self.list_queue(uri))
        return queue

    def release(self, queue: RedisQueue) -> None:
        """Drop ``queue`` from this node's view once no session here has it open: its
        messages are Redis's, and a node that kept every queue it ever served (an RPC
        reply queue per caller) would refresh all of them at every heartbeat. One with a
        claim or a give-back on its way is dropped when that is done (``busy``): a new
        view of the queue beside it would claim past it (``takes``)."""
        if (
            self._queues.get(queue.uri) is queue
            and not queue.handles
            and not queue.consumers
            and not queue.busy
        ):
            del self._queues[queue.uri]
            self.dropped_idle += 1

    def forget(self, uri: str) -> None:
        """Another node (or this one) deleted ``uri``: drop what this node cached."""
        self._listed.discard(uri)
        self.timed.pop(uri, None)
        queue = self._queues.get(uri)
        if queue is not None:
            self.release(queue)

    async def list_queue(self, uri: str) -> None:
        """Add ``uri`` to ``hf:queues`` once (``StoreError`` if Redis is out too long).
        The queues to list in one turn of the loop go in one SADD: a node that opens
        thousands at once makes one call, not thousands of connections."""
        if uri in self._listed:
            return
        future = self._to_list.get(uri)
        if future is None:
            if not self._to_list:
                asyncio.get_running_loop().call_soon(lambda: self.spawn(self._list_batch()))
            future = self._to_list[uri] = asyncio.get_running_loop().create_future()
        await asyncio.shield(future)

    async def _list_batch(self) -> None:
        batch, self._to_list = self._to_list, {}
        uris = list(batch)
        try:
            for start in range(0, len(uris), LIST_BATCH):
                chunk = uris[start : start + LIST_BATCH]
                await self.client.call(
                    "SADD queues", functools.partial(self.client.redis.sadd, QUEUES, *chunk)
                )
        except StoreError as error:
            for future in batch.values():
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # a waiter may be gone: not "never retrieved"
            return
        self._listed.update(uris)
        for future in batch.values():
            if not future.done():
                future.set_result(None)

    def spawn(self, work: Any) -> None:
        """Run ``work`` on the loop, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("redis store background work failed", exc_info=error)

    async def drain(self) -> None:
        """Write pending confirms and wait for background work."""
        self._flush()
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def confirmed(self, queue: RedisQueue, guid: bytes, consumer: Consumer) -> None:
        """Queue ``consumer``'s confirm for the next batch."""
        self.unrecorded.add(queue.uri, guid, consumer)
        self.recent.confirmed(queue.uri, guid)
        self._confirms.setdefault(queue.uri, []).append(guid)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        confirms, self._confirms = self._confirms, {}
        for uri, guids in confirms.items():
            self.spawn(self._confirm(uri, guids))

    async def _confirm(self, uri: str, guids: list[bytes]) -> None:
        try:
            await self.remove(uri, guids)
        except FencedError as error:  # the lease lapsed: a peer may give them out again
            log.error("%s: %d confirms refused (%s): revoked", uri, len(guids), error)
            self.unrecorded.void(uri, guids)
        except StoreError as error:
            # Owed, written by the sweep (else they would be delivered again when the
            # node ends).
            log.error("%s: %d confirms not recorded: %s", uri, len(guids), error)
            self.owed.confirm(uri, self.node_id, guids)
        queue = self._queues.get(uri)
        if queue is not None:
            queue.deliver()

    async def remove(self, uri: str, guids: list[bytes]) -> None:
        """Remove messages this node delivered (confirmed, or moved elsewhere)."""
        keys = QueueKeys(uri)
        _, seq = await self.client.run(
            scripts.confirm(keys, node=self.node_id, lease=self.lease(keys), guids=guids)
        )
        self.unrecorded.recorded(uri, guids)
        self.seqs.saw(uri, int(seq))

    async def requeue(self, uri: str, guids: list[bytes]) -> None:
        """Put messages this node delivered back at the head of ``uri``, in order."""
        keys = QueueKeys(uri)
        try:
            await self.client.run(
                scripts.requeue(keys, node=self.node_id, lease=self.lease(keys), guids=guids)
            )
        except StoreError as error:
            # Still in this node's deliveries: owed, tried again by the sweep.
            log.error("%s: could not requeue %d messages: %s", uri, len(guids), error)
            self.owed.add(uri, self.node_id, requeues=guids)
        self.wake(uri)

    async def delay(self, uri: str, guid: bytes, delay: float) -> None:
        """Hold a message this node delivered (rejected with a delay) for ``delay``
        seconds; the sweep releases it (``DELAY``)."""
        keys = QueueKeys(uri)
        due = self.now_ms() + round(delay * 1000)
        try:
            await self.client.run(
                policy_scripts.delay(
                    keys, node=self.node_id, lease=self.lease(keys), due_ms=due, guids=[guid]
                )
            )
        except StoreError as error:
            # Still this node's delivery: requeued below (owed if that fails too).
            log.error("%s: could not delay a rejected message: %s", uri, error)
            await self.requeue(uri, [guid])
            return
        self.timed[uri] = max(self.timed.get(uri, 0), due)

    async def settle(self, uri: str, released: int) -> None:
        """Apply the lifecycle's release guards to the first ``released`` messages at the
        head of ``uri`` (just put back there): bury those spent or past their TTL."""
        policy = self.policies.effective(uri)
        if released <= 0 or (policy.max_deliveries is None and policy.ttl is None):
            return
        now = self.now_ms()
        cutoff = ttl_cutoff_ms(now, policy.ttl)
        keys = QueueKeys(uri)
        await self.remember_queue(uri)
        raw = await self.takes.run(
            self.client,
            uri,
            SETTLING,
            lambda token: policy_scripts.settle(
                keys,
                node=self.node_id,
                lease=self.lease(keys),
                now_ms=now,
                cutoff_ms=cutoff,
                max_deliveries=policy.max_deliveries or 0,
                released=released,
                token=token,
            ),
        )
        settled = (Claimed(*row) for row in rows(raw, 5))
        dead = [
            (parse_message(uri, s.guid, s.payload, s.meta, s.deliveries), text(s.reason))
            for s in settled
        ]
        if dead:
            queue = self._queues.get(uri)
            if queue is not None:
                for _, reason in dead:
                    queue.dead[reason] += 1
            self.graveyard.bury(uri, dead)

    def count(self, uri: str, counter: str, n: int = 1) -> None:
        """Add ``n`` to a counter of ``uri`` kept in Redis (the admin's statistics)."""
        key = QueueKeys(uri).stats
        self.spawn(
            self.client.call("HINCRBY", lambda: self.client.command("HINCRBY", key, counter, n))
        )

    async def remember_queue(self, uri: str) -> None:
        """Note that this node holds deliveries of ``uri`` (for the reaper)."""
        if uri not in self._remembered:
            await self.client.call(
                "SADD", lambda: self.client.redis.sadd(node_queues(self.node_id), uri)
            )
            self._remembered.add(uri)

    def consumers_changed(self, queue: RedisQueue) -> None:
        """Publish this node's consumer count of ``queue`` (service discovery)."""
        self._publish_count(queue, queue.keys.consumers, len(queue.consumers))

    def handles_changed(self, queue: RedisQueue) -> None:
        """Publish this node's handle count of ``queue`` (deletes are refused while any
        node has it open)."""
        self._publish_count(queue, queue.keys.handles, queue.handles)

    def _publish_count(self, queue: RedisQueue, key: str, count: int) -> None:
        redis = self.client.redis
        if count:

            async def publish() -> None:
                # Listed first, so that the reaper removes the count if the node dies.
                await self.remember_queue(queue.uri)
                await self.client.call("HSET", lambda: redis.hset(key, self.node_id, count))

            self.spawn(publish())
        else:
            self.spawn(self.client.call("HDEL", lambda: redis.hdel(key, self.node_id)))

    def count_consumers(self, uri: str, answer: Callable[[int], None]) -> None:
        """Answer with the consumers of ``uri`` on every live node (service discovery)."""

        async def count() -> None:
            key = QueueKeys(uri).consumers
            try:
                counts = await self.client.call("HVALS", lambda: self.client.redis.hvals(key))
                total = sum(int(value) for value in counts)
            except StoreError as error:
                log.warning("%s: counting consumers: %s", uri, error)
                queue = self._queues.get(uri)
                total = 0 if queue is None else len(queue.consumers)
            answer(total)

        self.spawn(count())

    def wake(self, uri: str) -> None:
        """Tell every node that ``uri`` has messages (pub/sub; they also poll)."""
        self.spawn(self.client.call("PUBLISH", lambda: self.client.command("PUBLISH", WAKE, uri)))

    def on_wake(self, uri: str) -> None:
        """Another node (or this one) says ``uri`` has messages."""
        queue = self._queues.get(uri)
        if queue is not None:
            queue.deliver()


__all__ = ["RedisRegistry"]

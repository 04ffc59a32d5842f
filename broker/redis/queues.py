"""Queues on Redis, as the broker's sessions see them.

The session code is the same as for the in-memory queues: it opens a queue, attaches
consumers, confirms, rejects and detaches; the PUT path takes PutBatch frames. Here
a queue's messages live in Redis (``keys``) and each node holds only what it
delivered to its own consumers (``Consumer.unconfirmed``, as in memory):

- delivery is pull: while local consumers have room, the node claims that many
  messages (``CLAIM``: one atomic move from the ready list to the node's deliveries,
  counting the delivery) and PUSHes them round-robin to its consumers. Nodes claim
  only for consumers with room, so flow limits hold across nodes and work spreads
  over every node's consumers;
- a CONFIRM is taken off the consumer at once and written to Redis in one batch per
  turn of the loop (retried through an outage); a REJECT with requeue, or a consumer
  that leaves, puts its messages back at the head (``REQUEUE``);
- when a node dies its deliveries are reclaimed by the survivors (``nodes``).

Not on the Redis store yet: queue policies (delivery limits, TTL, dead letters, depth
limits), a delayed reject (it is requeued at once) and the admin service.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from holdfast.broker.consumers import Consumer
from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.keys import WAKE, QueueKeys, node_queues
from holdfast.broker.store import NO_PROPERTIES, StoredMessage, StoreError
from holdfast.proto import pb
from holdfast.proto.policy import NO_POLICY, QueuePolicy

log = logging.getLogger(__name__)

CLAIM_BATCH = 256
"""Most messages one claim takes."""

_OK = pb.STATUS_OK


class RedisQueue:
    """One queue: the local consumers of this node, and its Redis keys."""

    def __init__(self, uri: str, registry: RedisRegistry) -> None:
        self.uri = uri
        self.keys = QueueKeys(uri)
        self._registry = registry
        self._consumers: list[Consumer] = []
        self._next = 0
        self._claiming = False
        self.handles = 0
        self.policy: QueuePolicy = NO_POLICY
        self.remote_consumers = 0
        """Consumers attached on the other nodes (refreshed by the heartbeat)."""
        # Counters of the metrics collector (the in-memory queue's names).
        self.accepted = self.pushed = self.redelivered = self.dedup_hits = self.rejected = 0
        self.dead: Counter[str] = Counter()
        self.ready: tuple[()] = ()
        self.live_bytes = 0

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """The consumers attached on this node."""
        return tuple(self._consumers)

    @property
    def consumer_total(self) -> int:
        """Consumers on every node (others' as of the last heartbeat)."""
        return len(self._consumers) + self.remote_consumers

    @property
    def unconfirmed(self) -> int:
        """Messages this node's consumers hold."""
        return sum(len(c.unconfirmed) for c in self._consumers)

    def oldest_accepted_at(self) -> float | None:
        """Not known locally."""
        return None

    def attach(self, consumer: Consumer) -> None:
        """Start delivering to ``consumer``."""
        if consumer not in self._consumers:
            self._consumers.append(consumer)
            self._registry.consumers_changed(self)
        self.deliver()

    def detach(self, consumer: Consumer, redeliver: bool = True) -> int:
        """Stop delivering to ``consumer``; what it held goes back to the queue's head."""
        if consumer not in self._consumers:
            return 0
        self._consumers.remove(consumer)
        self._next = 0
        returned = [m.guid for m in consumer.unconfirmed.values()]
        consumer.unconfirmed.clear()
        consumer.unconfirmed_bytes = 0
        self._registry.consumers_changed(self)
        if returned:
            self._registry.spawn(self._requeue(returned))
        return len(returned)

    def confirm(self, consumer: Consumer, guid: bytes) -> bool:
        """Take ``guid`` off ``consumer``; the Redis confirm follows in a batch."""
        if consumer.take(guid) is None:
            return False
        self._registry.confirmed(self, guid)
        return True

    def reject(self, consumer: Consumer, guid: bytes, requeue: bool, delay: float) -> bool:
        """Give ``guid`` back: to the head with ``requeue`` (at once: delays are not kept
        on the Redis store), else dropped and counted (no dead-letter queues here)."""
        if consumer.take(guid) is None:
            return False
        self.rejected += 1
        if requeue:
            self._registry.spawn(self._requeue([guid]))
        else:
            self.dead["rejected"] += 1
            self._registry.confirmed(self, guid)
        return True

    def deliver(self) -> None:
        """Claim as many messages as local consumers have room for, and PUSH them."""
        if self._claiming or not self._consumers:
            return
        room = sum(
            max(0, c.limits.max_messages - len(c.unconfirmed))
            for c in self._consumers
            if c.has_room()
        )
        if room:
            self._claiming = True
            self._registry.spawn(self._claim(min(room, CLAIM_BATCH)))

    async def _claim(self, n: int) -> None:
        keys = self.keys
        node = self._registry.node_id
        try:
            await self._registry.remember_queue(self.uri)
            raw = await self._registry.client.script(
                "CLAIM",
                self._registry.client.claim_script,
                [keys.ready, keys.body, keys.meta, keys.count, keys.out(node)],
                [n, self._registry.now_ms()],
            )
        except StoreError as error:
            log.warning("%s: claiming failed: %s", self.uri, error)
            raw = []
        finally:
            self._claiming = False
        messages = [_message(self.uri, *raw[i : i + 4]) for i in range(0, len(raw), 4)]
        leftover = self._hand_out(messages)
        if leftover:
            await self._requeue([m.guid for m in leftover])
        if len(messages) == n:
            self.deliver()  # there may be more

    def _hand_out(self, messages: list[StoredMessage]) -> list[StoredMessage]:
        consumers = self._consumers
        leftover: list[StoredMessage] = []
        for message in messages:
            for _ in range(len(consumers)):
                consumer = consumers[self._next % len(consumers)]
                self._next += 1
                if consumer.has_room():
                    consumer.unconfirmed[message.guid] = message
                    consumer.unconfirmed_bytes += len(message.payload)
                    consumer.sink.push(consumer.queue_id, message, message.delivery_count)
                    self.pushed += 1
                    self.redelivered += message.delivery_count > 1
                    break
            else:
                leftover.append(message)
        return leftover

    async def _requeue(self, guids: list[bytes]) -> None:
        keys = self.keys
        try:
            await self._registry.client.script(
                "REQUEUE",
                self._registry.client.requeue_script,
                [keys.ready, keys.out(self._registry.node_id)],
                guids,
            )
        except StoreError as error:
            # Still in this node's deliveries: reclaimed if the node dies, else later.
            log.error("%s: could not requeue %d messages: %s", self.uri, len(guids), error)
        self._registry.wake(self.uri)


def _message(uri: str, guid: bytes, payload: bytes, meta: bytes, count: int) -> StoredMessage:
    digest, accepted, properties = meta.split(b"|", 2)
    return StoredMessage(
        uri,
        guid,
        payload,
        json.loads(properties) if properties != b"{}" else NO_PROPERTIES,
        int(accepted) / 1000,
        int(count),
        int(digest),
    )


class RedisRegistry:
    """This node's view of the queues, and the background work they need."""

    def __init__(self, client: RedisClient, node_id: str, now_ms: Callable[[], int]) -> None:
        self.client = client
        self.node_id = node_id
        self.now_ms = now_ms
        self._queues: dict[str, RedisQueue] = {}
        self._confirms: dict[str, list[bytes]] = {}
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._remembered: set[str] = set()
        self.budget = None
        self.graveyard = _NoGraveyard()
        self.dropped_idle = 0

    def __iter__(self) -> Iterator[RedisQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, uri: str) -> RedisQueue | None:
        """The queue at ``uri`` if this node has it open."""
        return self._queues.get(uri)

    def open(self, uri: str) -> RedisQueue:
        """The queue at ``uri`` (queues exist in Redis as soon as they hold a message)."""
        queue = self._queues.get(uri)
        if queue is None:
            queue = self._queues[uri] = RedisQueue(uri, self)
        return queue

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

    def confirmed(self, queue: RedisQueue, guid: bytes) -> None:
        """Queue a confirm for the next batch."""
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
        keys = QueueKeys(uri)
        try:
            await self.client.script(
                "CONFIRM",
                self.client.confirm_script,
                [keys.body, keys.meta, keys.count, keys.out(self.node_id)],
                guids,
            )
        except StoreError as error:
            # Not lost: the messages stay this node's deliveries, redelivered if it dies.
            log.error("%s: %d confirms not recorded: %s", uri, len(guids), error)
        queue = self._queues.get(uri)
        if queue is not None:
            queue.deliver()

    async def remember_queue(self, uri: str) -> None:
        """Note that this node holds deliveries of ``uri`` (for the reaper)."""
        if uri not in self._remembered:
            await self.client.call(
                "SADD", lambda: self.client.redis.sadd(node_queues(self.node_id), uri)
            )
            self._remembered.add(uri)

    def consumers_changed(self, queue: RedisQueue) -> None:
        """Publish this node's consumer count of ``queue`` (service discovery)."""
        count = len(queue.consumers)
        redis = self.client.redis
        if count:
            self.spawn(
                self.client.call(
                    "HSET", lambda: redis.hset(queue.keys.consumers, self.node_id, count)
                )
            )
        else:
            self.spawn(
                self.client.call("HDEL", lambda: redis.hdel(queue.keys.consumers, self.node_id))
            )

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
        self.spawn(self.client.call("PUBLISH", lambda: self.client.redis.publish(WAKE, uri)))

    def on_wake(self, uri: str) -> None:
        """Another node (or this one) says ``uri`` has messages."""
        queue = self._queues.get(uri)
        if queue is not None:
            queue.deliver()


class _NoGraveyard:
    """The metrics collector reads dropped dead letters; none are kept here."""

    dropped: Counter[str] = Counter()


__all__ = ["RedisQueue", "RedisRegistry"]

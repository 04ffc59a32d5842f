"""The Redis store of one lifecycle walk: two broker nodes' queue machinery on one
redis-server, on a manual clock, driven one event at a time, and read back as
lifecycle states.

Node ``a`` PUTs, delivers, settles and sweeps; node ``b`` is the survivor that reaps
``a`` when it is lost. No node loop runs (heartbeat, poll, wake-ups, sweeps): the walk
calls each step itself, so nothing moves a message between two looks.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from holdfast.broker.consumers import Consumer, FlowLimits
from holdfast.broker.lifecycle import State
from holdfast.broker.redis.admin import RedisAdmin
from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.keys import NODES, QueueKeys, lease_key
from holdfast.broker.redis.puts import RedisPutPipeline
from holdfast.broker.redis.queues import RedisQueue, parse_message
from holdfast.broker.redis.reaper import Reaper
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.staging import RedisStaging, VersionKeys
from holdfast.broker.redis.sweep import Sweeper
from holdfast.broker.staging import (
    ANONYMOUS_TOKEN,
    AttemptKey,
    StagedRow,
    StageOutcome,
    StagingLimits,
)
from holdfast.broker.store import StoredMessage
from holdfast.proto import pb
from holdfast.proto.columns import PutRow
from holdfast.proto.limits import Limits
from holdfast.proto.policy import DEATH_REASON, DELIVERY_COUNT, PICKUP_TTL, QueuePolicy


class Clock:
    """Both nodes' wall clock (ms), moved by the walk only."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


class Sink:
    """The consumer's PUSHes: delivery count by GUID, as last PUSHed."""

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        self.counts[message.guid] = delivery_count

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        raise AssertionError("only a Redis node that lost its lease revokes deliveries")


@dataclass(frozen=True, slots=True)
class Seen:
    """Where the store has one message, as a lifecycle state."""

    state: State | None
    """``None``: gone from the queue and not dead-lettered (confirmed or purged)."""
    delivery_count: int
    reason: str | None = None


STAGE_RETENTION = 100.0
"""Seconds a staged row of the walk waits for its commit."""

APP = "walk"
"""The writer application of the walk's staged rows (version 1, partition 0, attempt 0)."""


class RedisWorld:
    """One queue on Redis, its dead-letter queue, two nodes and one consumer."""

    def __init__(self, url: str) -> None:
        tag = uuid.uuid4().hex[:10]
        self.uri = f"hf://walk/q-{tag}"
        self.dead_letter = f"hf://walk/dlq-{tag}"
        self.keys = QueueKeys(self.uri)
        self.clock = Clock()
        self.client = RedisClient(parse_redis_spec(url), retry_window=5.0)
        self.a = RedisRegistry(self.client, f"walk-a-{tag}", self.clock)
        self.b = RedisRegistry(self.client, f"walk-b-{tag}", self.clock)
        self.survivor = Reaper(self.b)
        self.sweeper = Sweeper(self.a)
        self.puts = RedisPutPipeline(self.a, Limits(), retention_ms=600_000)
        self.sink = Sink()
        self.consumer = Consumer(1, self.sink, FlowLimits(max_messages=1))
        self.queue: RedisQueue = self.a.open(self.uri)
        self.staging = RedisStaging(
            self.client, self.a, StagingLimits(retention=STAGE_RETENTION), 600_000
        )
        self.attempt = VersionKeys(self.uri, APP, 1).attempt(0, 0)

    async def start(self) -> None:
        """Keep the queue open on node ``a`` (so its sweep visits it), give both nodes a
        lease (no TTL: the walk's clock is not Redis's) and list ``a`` among the nodes:
        the survivor's reaper takes it for dead once its lease is gone."""
        for node in (self.a, self.b):
            await self.client.redis.set(lease_key(node.node_id), 1)
        self.queue.handles = 1
        await self.client.redis.hset(NODES, self.a.node_id, self.clock())
        await self.settle()

    async def close(self) -> None:
        """Wait for the background work, take ``a`` off the node list, disconnect."""
        await self.settle()
        await self.client.redis.hdel(NODES, self.a.node_id)
        for node in (self.a, self.b):
            await self.client.redis.delete(lease_key(node.node_id))
        await self.client.close()

    async def settle(self) -> None:
        """Let both nodes finish their background work (claims, requeues, burials)."""
        await self.a.drain()
        await self.b.drain()
        await self.a.drain()

    async def set_policy(self, max_deliveries: int | None, ttl: float | None) -> None:
        """Set the queue's policy (with its dead-letter queue) and let both nodes read it."""
        policy = QueuePolicy(max_deliveries=max_deliveries, ttl=ttl, dead_letter=self.dead_letter)
        await self.a.policies.set(self.uri, policy)
        await self.b.policies.refresh()

    async def put(self, guid: bytes, pickup_s: float | None) -> None:
        """PUT one message (with a pickup TTL of ``pickup_s`` seconds if given)."""
        properties = {} if pickup_s is None else {PICKUP_TTL: str(round(pickup_s * 1000))}
        # One byte: the smallest payload, so a removal that skips it (``size > 1``) shows
        # in the queue's payload bytes.
        put = PutRow(1, guid, b"w", properties, 0)
        before = await self.write_sequence()
        [status] = await self.puts._put(self.uri, [put])
        assert status == pb.STATUS_OK
        assert await self.write_sequence() == before + 1, "a PUT that stored kept the sequence"

    async def stage(self, guid: bytes) -> None:
        """Stage one row for the walk's attempt."""
        key = AttemptKey(self.uri, APP, 1, 0, 0)
        row = StagedRow(guid, b"walk", {})
        assert await self.staging.stage(key, [row], ANONYMOUS_TOKEN) is StageOutcome.STAGED

    async def commit(self) -> None:
        """The driver commits the walk's attempt."""
        reply = await self.staging.commit(self.uri, APP, 1, {(0, 0): 1}, b"d", 1)
        assert (reply.status, reply.published) == (pb.STATUS_OK, 1), reply
        await self.settle()

    async def discard(self) -> None:
        """The driver aborts the walk's version."""
        assert await self.staging.abort(self.uri, APP, 1) == 1

    async def deliver(self) -> None:
        """The consumer attaches (or is attached) and node ``a`` claims for it."""
        if self.consumer in self.queue.consumers:
            self.queue.deliver()
        else:
            self.queue.attach(self.consumer)
        await self.settle()

    def held(self) -> bytes:
        """The one GUID the consumer holds."""
        [guid] = self.consumer.unconfirmed
        return guid

    async def confirm(self) -> None:
        before = await self.write_sequence()
        assert self.queue.confirm(self.consumer, self.held())
        await self.settle()
        assert await self.write_sequence() == before + 1, "a confirm kept the sequence"

    async def write_sequence(self) -> int:
        """The queue's write sequence: every script that changed the queue moves it on
        by one (what the node's loss check compares, ``losses``)."""
        return int(await self.client.redis.get(self.keys.seq) or 0)

    async def reject(self, requeue: bool, delay: float = 0.0) -> None:
        assert self.queue.reject(self.consumer, self.held(), requeue, delay)
        await self.settle()

    async def session_lost(self) -> None:
        """The consumer's session closes: what it held goes back."""
        self.queue.detach(self.consumer)
        await self.settle()

    async def node_lost(self) -> None:
        """Node ``a`` is gone (its lease expired): the survivor's reaper reclaims its
        deliveries."""
        await self.client.redis.delete(lease_key(self.a.node_id))
        await self.survivor.reap()
        # The walk goes on with ``a`` as a node that rejoined (its old deliveries are
        # the survivor's now), under the same name for the walk's bookkeeping.
        await self.client.redis.set(lease_key(self.a.node_id), 1)
        await self.settle()

    async def sweep(self) -> None:
        """Node ``a``'s sweep: reject delays over, TTLs, pickup deadlines, staged rows
        past their deadline."""
        await self.sweeper.sweep()
        await self.staging.sweep()
        await self.settle()

    async def purge(self) -> None:
        await RedisAdmin(self.a).purge(self.uri)
        await self.settle()

    async def no_trace(self, guid: bytes) -> None:
        """A message that left the queue (confirmed, purged, dead-lettered) leaves
        nothing behind in it: no meta, delivery count or pickup deadline (keys that
        would grow for ever), the queue's payload bytes (its ``max_bytes`` measure) back
        to 0 (each walk's queue holds one message), and its GUID in no list or set."""
        redis = self.client.redis
        assert await redis.hget(self.keys.meta, guid) is None, "meta left behind"
        assert await redis.hget(self.keys.count, guid) is None, "delivery count left behind"
        assert await redis.zscore(self.keys.pickup, guid) is None, "pickup deadline left"
        assert int(await redis.get(self.keys.bytes) or 0) == 0, "payload bytes left counted"
        # ...nor a place it could be delivered or buried from again.
        assert await redis.lpos(self.keys.ready, guid) is None, "left in the ready list"
        assert await redis.zscore(self.keys.delayed, guid) is None, "left delayed"
        for node in (self.a.node_id, self.b.node_id):
            assert await redis.zscore(self.keys.out(node), guid) is None, "left held"

    async def seen(self, guid: bytes) -> Seen:
        """Where the store has ``guid``; it must be in one place only."""
        redis = self.client.redis
        dlq = QueueKeys(self.dead_letter)
        meta = await redis.hget(dlq.meta, guid)
        if meta is not None:
            assert await redis.hget(self.keys.body, guid) is None, "dead-lettered and kept"
            await self.no_trace(guid)
            copy = parse_message(self.dead_letter, guid, b"", meta, 0)
            return Seen(
                State.DEAD,
                int(copy.properties[DELIVERY_COUNT]),
                copy.properties[DEATH_REASON],
            )
        assert not await redis.hexists(self.keys.leaving, guid), "a burial did not finish"
        if await redis.hexists(self.attempt, guid):
            assert await redis.hget(self.keys.body, guid) is None, "staged and published"
            return Seen(State.STAGED, 0)
        places = []
        if await redis.lpos(self.keys.ready, guid) is not None:
            places.append(State.READY)
        if await redis.zscore(self.keys.delayed, guid) is not None:
            places.append(State.DELAYED)
        for node in (self.a.node_id, self.b.node_id):
            if await redis.zscore(self.keys.out(node), guid) is not None:
                places.append(State.HELD)
        count = int(await redis.hget(self.keys.count, guid) or 0)
        if await redis.hget(self.keys.body, guid) is None:
            assert not places, f"{guid!r} has no body but is listed in {places}"
            await self.no_trace(guid)
            return Seen(None, count)
        assert len(places) == 1, f"{guid!r} is in {places}"
        # A pickup deadline is for a message never delivered: the first delivery ends it.
        if count > 0:
            assert await redis.zscore(self.keys.pickup, guid) is None, "delivered, pickup kept"
        return Seen(places[0], count)


def in_world(redis_url: str, body: Callable[[RedisWorld], Awaitable[None]]) -> None:
    """Run ``body`` against a started ``RedisWorld`` on ``redis_url``, closed after."""

    async def run() -> None:
        world = RedisWorld(redis_url)
        await world.start()
        try:
            await body(world)
        finally:
            await world.close()

    asyncio.run(run())


__all__ = ["Clock", "RedisWorld", "Seen", "Sink", "in_world"]

"""Broker nodes sharing one Redis: liveness, reclaiming, wake-ups, data loss.

Halibut's way: every node writes its liveness key (``hf:node:<id>``) every
``HEARTBEAT`` seconds with a TTL of ``MISSES`` heartbeats, and lists itself in
``hf:nodes``. Every node also reaps: a node listed whose liveness key is gone has
died, and its unconfirmed deliveries go back to the head of their queues
(``RECLAIM``), so survivors redeliver them. A dead node's deliveries are back within
``MISSES * HEARTBEAT + HEARTBEAT`` seconds (4 s with the defaults) of its last
heartbeat. Reclaiming is idempotent: two survivors reaping the same node move each
message once (the script empties the dead node's set as it moves it).

Wake-ups use pub/sub (``hf:wake``, a queue URI per message), but pub/sub loses
messages when a subscriber is disconnected, so every queue with consumers is also
polled every ``POLL`` seconds. Policy changes and deleted queues are announced on
``hf:changed``; the heartbeat re-reads the policies too. The timed rules (reject
delays, TTLs) run in ``sweep``.

Data loss: at start a node sets ``hf:generation`` (a random id) unless it exists,
and every heartbeat checks it. A generation that vanished or changed means Redis lost
data (restarted without persistence, flushed, failed over to a replica that had not
received it): the node logs an ERROR, counts it (``data_losses``), tells every
connected session with a ``STORE_ERROR`` error frame, and adopts the new generation.
The GUID history may have lost entries, so replays within the window may be taken
again: the loss is reported, never passed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.keys import (
    CHANGED,
    FORGET,
    GENERATION,
    NODES,
    WAKE,
    QueueKeys,
    node_key,
    node_queues,
)
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.sweep import FAST, Sweeper
from holdfast.broker.store import StoreError

log = logging.getLogger(__name__)

HEARTBEAT = 1.0
"""Seconds between a node's heartbeats."""

MISSES = 3
"""Heartbeats a node may miss before it is presumed dead."""

POLL = 0.2
"""Seconds between polls of the queues this node has consumers on."""


class NodeLife:
    """This node's heartbeat, reaper, wake-up listener and data-loss check."""

    def __init__(
        self,
        client: RedisClient,
        registry: RedisRegistry,
        on_data_loss: Callable[[str], None],
    ) -> None:
        self.client = client
        self.registry = registry
        self.node_id = registry.node_id
        self._on_data_loss = on_data_loss
        self._generation: bytes | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.data_losses = 0
        """Times this node found that Redis had lost data."""
        self.reclaimed = 0
        """Deliveries of dead nodes this node put back."""

    async def start(self) -> None:
        """Register, adopt the generation, and start the loops. Raises ``StoreError``
        if Redis cannot be reached (within the retry window)."""
        redis = self.client.redis
        fresh = uuid.uuid4().hex.encode()
        await self.client.call("SET generation", lambda: redis.set(GENERATION, fresh, nx=True))
        self._generation = await self.client.call("GET generation", lambda: redis.get(GENERATION))
        await self._beat()
        await self.registry.policies.refresh()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeats(), name="redis heartbeat"),
            loop.create_task(self._poll(), name="redis poll"),
            loop.create_task(self._sweeps(), name="redis sweep"),
        ]
        if not self.client.spec.cluster:  # cluster pub/sub is not in redis-py's asyncio API
            self._tasks.append(loop.create_task(self._listen(), name="redis wake-ups"))

    async def stop(self) -> None:
        """Stop the loops and leave the node list (what this node delivered and was not
        confirmed goes back at once instead of after the liveness timeout)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(StoreError):
            await self._reclaim(self.node_id)

    async def _beat(self) -> None:
        redis = self.client.redis
        ttl_ms = round(HEARTBEAT * MISSES * 1000)
        now = self.registry.now_ms()
        await self.client.call(
            "heartbeat", lambda: redis.set(node_key(self.node_id), now, px=ttl_ms)
        )
        await self.client.call("node list", lambda: redis.hset(NODES, self.node_id, now))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self._beat()
                await self._check_generation()
                await self._reap()
                await self._refresh_queues()
                await self.registry.policies.refresh()
            except StoreError as error:
                log.warning("redis heartbeat: %s", error)
            except Exception:
                log.exception("redis heartbeat failed")

    async def _check_generation(self) -> None:
        redis = self.client.redis
        current = await self.client.call("GET generation", lambda: redis.get(GENERATION))
        if current == self._generation and current is not None:
            return
        self.data_losses += 1
        why = "the generation marker is gone" if current is None else "the generation changed"
        message = (
            f"redis store {self.client.where} LOST DATA ({why}): it restarted without "
            "persistence, was flushed, or failed over to a replica that had not received "
            "everything; ACKed messages and GUID history may be gone"
        )
        log.error("%s", message)
        self._on_data_loss(message)
        if current is None:
            fresh = uuid.uuid4().hex.encode()
            await self.client.call("SET generation", lambda: redis.set(GENERATION, fresh, nx=True))
            current = await self.client.call("GET generation", lambda: redis.get(GENERATION))
        self._generation = current

    async def _reap(self) -> None:
        redis = self.client.redis
        nodes = await self.client.call("node list", lambda: redis.hkeys(NODES))
        for raw in nodes:
            node = raw.decode() if isinstance(raw, bytes) else str(raw)
            if node == self.node_id:
                continue
            alive = await self.client.call(
                "liveness", functools.partial(redis.exists, node_key(node))
            )
            if not alive:
                moved = await self._reclaim(node)
                log.warning("node %s is gone: %d of its deliveries put back", node, moved)

    async def _reclaim(self, node: str) -> int:
        redis = self.client.redis
        queues = await self.client.call("node queues", lambda: redis.smembers(node_queues(node)))
        moved = 0
        for raw in queues:
            uri = raw.decode() if isinstance(raw, bytes) else str(raw)
            keys = QueueKeys(uri)
            back = int(
                await self.client.run(
                    "RECLAIM",
                    [keys.ready, keys.out(node), keys.consumers, keys.handles],
                    [node],
                )
            )
            moved += back
            await self.registry.settle(uri, back)
            # Its moves to dead-letter queues, unfinished, are finished now.
            await self.registry.graveyard.finish_stale(uri, age=0)
            self.registry.wake(uri)
        await self.client.call("forget node", lambda: redis.delete(node_queues(node)))
        await self.client.call("forget node", lambda: redis.hdel(NODES, node))
        self.reclaimed += moved
        return moved

    async def _refresh_queues(self) -> None:
        """Read each open queue's consumers on other nodes, depth and bytes (service
        discovery and the metrics)."""
        redis = self.client.redis
        for queue in self.registry:
            counts: dict[Any, Any] = await self.client.call(
                "consumers", functools.partial(redis.hgetall, queue.keys.consumers)
            )
            keys = queue.keys
            ready, delayed, size = await self.client.call(
                "depth", functools.partial(_depth, redis, keys.ready, keys.delayed, keys.bytes)
            )
            queue.ready.count = int(ready) + int(delayed)
            queue.live_bytes = int(size or 0)
            queue.remote_consumers = sum(
                int(v)
                for k, v in counts.items()
                if (k.decode() if isinstance(k, bytes) else k) != self.node_id
            )

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL)
            for queue in self.registry:
                if queue.consumers:
                    queue.deliver()

    async def _sweeps(self) -> None:
        sweeper = Sweeper(self.registry)
        while True:
            await asyncio.sleep(FAST)
            try:
                await sweeper.sweep()
            except Exception:
                log.exception("redis sweep failed")

    async def _changed(self, what: str) -> None:
        if what.startswith(FORGET):
            self.registry.forget(what[len(FORGET) :])
        else:
            await self.registry.policies.refresh()

    async def _listen(self) -> None:
        while True:
            pubsub: Any = None
            try:
                pubsub = self.client.redis.pubsub()
                await pubsub.subscribe(WAKE, CHANGED)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    data = message["data"]
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    channel = message["channel"]
                    if channel in (WAKE, WAKE.encode()):
                        self.registry.on_wake(text)
                    else:
                        await self._changed(text)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a lost subscription: polling covers the gap
                log.debug("redis wake-ups: %s", error)
                await asyncio.sleep(HEARTBEAT)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()


async def _depth(redis: Any, ready: str, delayed: str, size: str) -> list[Any]:
    """LLEN, ZCARD and the byte count of one queue, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    pipe.llen(ready)
    pipe.zcard(delayed)
    pipe.get(size)
    result: list[Any] = await pipe.execute()
    return result


__all__ = ["HEARTBEAT", "MISSES", "POLL", "NodeLife"]

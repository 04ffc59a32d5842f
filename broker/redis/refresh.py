"""Reading the open queues' counts from Redis: consumers on other nodes (service
discovery), depth and bytes (the metrics), unsynced messages (``durable``). It is
bookkeeping, not liveness: it runs apart from the lease, and by the batch: one
``COUNTS`` script per ``BATCH`` queues (a pipeline of five commands per queue on a
cluster, where a script sees one slot). A pipeline of 20,000 replies cost redis-py
1.1-2.8 s of event loop at 4,000 queues (measured); the script's one array reply a
fraction of that."""

from __future__ import annotations

from typing import Any

from holdfast.broker.redis.queues import RedisQueue
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.script import rows, text
from holdfast.broker.redis.scripts import QueueCounts, counts

BATCH = 500
"""Queues read in one call."""


async def refresh_queues(registry: RedisRegistry) -> None:
    """Refresh every open queue's remote consumers, ready count, bytes and unsynced."""
    queues = list(registry)
    for start in range(0, len(queues), BATCH):
        chunk = queues[start : start + BATCH]
        if registry.client.spec.cluster:
            found = await _pipelined(registry, chunk)
        else:
            raw = await registry.client.run(
                counts([queue.keys for queue in chunk], node=registry.node_id)
            )
            found = [QueueCounts(*(int(v) for v in row)) for row in rows(raw, 4)]
        for queue, (depth, size, unsynced, others) in zip(chunk, found, strict=True):
            queue.ready.count = depth
            queue.live_bytes = size
            queue.remote_consumers = others
            if unsynced:
                # Another node's, one it died with, or left from a run with
                # --redis-min-replicas (this node may run without: ``durable``).
                registry.unsynced.add(queue.uri)


async def _pipelined(registry: RedisRegistry, chunk: list[RedisQueue]) -> list[QueueCounts]:
    client = registry.client

    async def read() -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        # COUNTS's reads, a command each: on a cluster a script sees one slot.
        for queue in chunk:
            keys = queue.keys
            pipe.llen(keys.ready)
            pipe.zcard(keys.delayed)
            pipe.get(keys.bytes)
            pipe.llen(keys.unsynced)
            pipe.hgetall(keys.consumers)
        result: list[Any] = await pipe.execute()
        return result

    raw = await client.call("queue counts", read)
    found: list[QueueCounts] = []
    for ready, delayed, size, unsynced, consumers in rows(raw, 5):
        others = sum(int(v) for k, v in consumers.items() if text(k) != registry.node_id)
        found.append(QueueCounts(int(ready) + int(delayed), int(size or 0), int(unsynced), others))
    return found


__all__ = ["BATCH", "refresh_queues"]

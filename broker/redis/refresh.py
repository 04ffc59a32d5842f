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

BATCH = 500
"""Queues read in one call."""


async def refresh_queues(registry: RedisRegistry) -> None:
    """Refresh every open queue's remote consumers, ready count, bytes and unsynced."""
    queues = list(registry)
    for start in range(0, len(queues), BATCH):
        chunk = queues[start : start + BATCH]
        if registry.client.spec.cluster:
            values = await _pipelined(registry, chunk)
        else:
            keys = [key for queue in chunk for key in _keys(queue)]
            values = await registry.client.run("COUNTS", keys, [registry.node_id])
        for i, queue in enumerate(chunk):
            depth, size, unsynced, others = (int(v) for v in values[4 * i : 4 * i + 4])
            queue.ready.count = depth
            queue.live_bytes = size
            queue.remote_consumers = others
            if unsynced and registry.client.min_replicas:
                registry.unsynced.add(queue.uri)  # another node's, or one it died with


def _keys(queue: RedisQueue) -> tuple[str, str, str, str, str]:
    keys = queue.keys
    return (keys.ready, keys.delayed, keys.bytes, keys.unsynced, keys.consumers)


async def _pipelined(registry: RedisRegistry, chunk: list[RedisQueue]) -> list[int]:
    client = registry.client

    async def read() -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        for queue in chunk:
            ready, delayed, size, unsynced, consumers = _keys(queue)
            pipe.llen(ready)
            pipe.zcard(delayed)
            pipe.get(size)
            pipe.llen(unsynced)
            pipe.hgetall(consumers)
        result: list[Any] = await pipe.execute()
        return result

    raw = await client.call("queue counts", read)
    values: list[int] = []
    for i in range(len(chunk)):
        ready, delayed, size, unsynced, counts = raw[5 * i : 5 * i + 5]
        others = sum(
            int(v)
            for k, v in counts.items()
            if (k.decode() if isinstance(k, bytes) else k) != registry.node_id
        )
        values += [int(ready) + int(delayed), int(size or 0), int(unsynced), others]
    return values


__all__ = ["BATCH", "refresh_queues"]

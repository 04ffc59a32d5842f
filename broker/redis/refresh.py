"""Reading the open queues' counts from Redis: consumers on other nodes (service
discovery), depth and bytes (the metrics). It is bookkeeping, not liveness: it runs
apart from the lease, and by the batch, so a node with 100,000 open queues makes one
round trip per ``BATCH`` queues."""

from __future__ import annotations

from typing import Any

from holdfast.broker.redis.registry import RedisRegistry

BATCH = 500
"""Queues read in one pipeline."""


async def refresh_queues(registry: RedisRegistry) -> None:
    """Refresh every open queue's remote consumers, ready count and bytes."""
    client = registry.client
    queues = list(registry)
    for start in range(0, len(queues), BATCH):
        chunk = queues[start : start + BATCH]

        async def read(chunk: list[Any] = chunk) -> list[Any]:
            pipe = client.redis.pipeline(transaction=False)
            for queue in chunk:
                keys = queue.keys
                pipe.hgetall(keys.consumers)
                pipe.llen(keys.ready)
                pipe.zcard(keys.delayed)
                pipe.get(keys.bytes)
                pipe.llen(keys.unsynced)
            result: list[Any] = await pipe.execute()
            return result

        values = await client.call("queue counts", read)
        for i, queue in enumerate(chunk):
            counts, ready, delayed, size, unsynced = values[5 * i : 5 * i + 5]
            if int(unsynced) and client.min_replicas:
                registry.unsynced.add(queue.uri)  # another node's, or one it died with
            queue.ready.count = int(ready) + int(delayed)
            queue.live_bytes = int(size or 0)
            queue.remote_consumers = sum(
                int(v)
                for k, v in counts.items()
                if (k.decode() if isinstance(k, bytes) else k) != registry.node_id
            )


__all__ = ["BATCH", "refresh_queues"]

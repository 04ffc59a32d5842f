"""The Redis node's liveness at 1, 4,000 and 100,000 open queues, for ``make bench``
(issue #32): the lease renewal's time (it runs on a thread and a connection of its
own, one round trip whatever the load), beside what does grow with the queues and
runs apart from it: one pass reading the open queues' counts, one loss check.

A node (``NodeLife`` with its registry, in this process, on a redis-server of its
own) opens N queues, then the renewals are sampled for a few seconds while the
node's event loop refreshes them all every second."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import harness  # noqa: F401  (puts the repository on sys.path, for tests.support)

from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.keys import QUEUES
from holdfast.broker.redis.nodes import NodeLife
from holdfast.broker.redis.refresh import refresh_queues
from holdfast.broker.redis.registry import RedisRegistry
from tests.support.redis_server import RedisServer

COUNTS = (1, 4_000, 100_000)
"""Open queues measured."""

SAMPLE_SECONDS = 4.0
"""How long renewals are sampled at each count."""


async def _measure(url: str, queues: int) -> dict[str, Any]:
    client = RedisClient(parse_redis_spec(url))
    registry = RedisRegistry(client, uuid.uuid4().hex, lambda: time.time_ns() // 1_000_000)
    life = NodeLife(client, registry, lambda loss: None)
    await life.start()
    try:
        for i in range(queues):
            registry.open(f"hf://beat/q-{i}")
        listed = 0
        while listed < queues:  # every queue listed in Redis (the node's own tasks)
            await asyncio.sleep(0.1)
            listed = await client.redis.scard(QUEUES)
        started = time.perf_counter()
        await refresh_queues(registry)
        refresh = time.perf_counter() - started
        started = time.perf_counter()
        await life.losses.check()
        check = time.perf_counter() - started
        samples: list[float] = []
        seen = life.keeper.renewals
        deadline = time.monotonic() + SAMPLE_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if life.keeper.renewals != seen:
                seen = life.keeper.renewals
                samples.append(life.keeper.last_renewal_seconds)
        return {
            "queues": queues,
            "renewals": len(samples),
            "renewal_p50_ms": statistics.median(samples) * 1000 if samples else float("nan"),
            "renewal_max_ms": max(samples) * 1000 if samples else float("nan"),
            "lapses": life.keeper.lapses,
            "refresh_ms": refresh * 1000,
            "loss_check_ms": check * 1000,
        }
    finally:
        await life.stop()
        await client.close()


def heartbeat_figures() -> list[dict[str, Any]]:
    """One row per count of open queues."""
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory), aof=False).start()
        try:
            for count in COUNTS:
                redis.cli("FLUSHALL")
                rows.append(asyncio.run(_measure(redis.url, count)))
        finally:
            redis.stop()
    return rows


__all__ = ["COUNTS", "heartbeat_figures"]

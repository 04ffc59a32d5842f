"""A broker node's Redis back-end: the client, the queues, the PUT path and the
node's life, started and stopped together (``Broker`` uses it for ``--store
redis...``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from holdfast.broker.config import BrokerConfig
from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.cover import record_cover
from holdfast.broker.redis.lease import LeaseTiming
from holdfast.broker.redis.losses import DataLoss
from holdfast.broker.redis.marks import RedisMarks
from holdfast.broker.redis.nodes import NodeLife
from holdfast.broker.redis.puts import RedisPutPipeline
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.staging import RedisStaging

log = logging.getLogger(__name__)

STAGING_SWEEP = 1.0
"""Seconds between sweeps of staged rows (deadlines are days; a second is plenty)."""


def _now_ms() -> int:
    # Wall clock: acceptance times are shared by nodes on different hosts.
    return time.time_ns() // 1_000_000


class RedisBackend:
    """Everything a broker node needs to serve queues kept in Redis."""

    def __init__(
        self,
        config: BrokerConfig,
        node_id: str,
        on_data_loss: Callable[[DataLoss], None],
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        spec = parse_redis_spec(config.store)
        self.client = RedisClient(
            spec,
            retry_window=config.redis_retry,
            min_replicas=config.redis_min_replicas,
            tls=config.redis_tls,
        )
        retention_ms = self._retention_ms = round((config.dedup_window + config.dedup_grace) * 1000)
        self.queues = RedisRegistry(
            self.client, node_id, _now_ms if now_ms is None else now_ms, retention_ms
        )
        self.life = NodeLife(
            self.client, self.queues, on_data_loss, LeaseTiming(config.redis_lease)
        )
        self.puts = RedisPutPipeline(self.queues, config.limits, retention_ms, self.life.journal)
        self.staging = RedisStaging(
            self.client, self.queues, config.staging, retention_ms, self.life.journal
        )
        """Transactional writes' staged rows, kept in Redis."""
        self.marks = RedisMarks(self.client, self.queues.now_ms)
        """Commit marks, kept in Redis."""
        self._staging_sweep: asyncio.Task[int] | None = None
        self._staging_swept = 0.0

    def sweep_staging(self) -> None:
        """Start a sweep of staged rows past their deadline, unless one is under way or
        the last began less than ``STAGING_SWEEP`` seconds ago (on the running loop)."""
        task = self._staging_sweep
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("sweeping staged rows failed: %s", task.exception())
        now = time.monotonic()
        if now - self._staging_swept < STAGING_SWEEP:
            return
        self._staging_swept = now
        self._staging_sweep = asyncio.get_running_loop().create_task(self.staging.sweep())

    async def start(self) -> None:
        """Reach Redis (``StoreError`` after the retry window), register the node, and
        record its retention in the history cover (``redis.cover``)."""
        await self.life.start()
        since = await record_cover(self.client, self._retention_ms, self.queues.now_ms())
        self.puts.cover.recovered(since)

    async def stop(self) -> None:
        """Finish PUTs and confirms, give this node's deliveries back, disconnect. The
        node's loops stop first: a poll that keeps claiming would keep the drain going."""
        await self.life.halt()
        await self.puts.drain()
        if self._staging_sweep is not None:
            self._staging_sweep.cancel()
        await self.queues.drain()
        await self.life.stop()
        await self.client.close()


__all__ = ["RedisBackend"]

"""Reclaiming the deliveries of node incarnations whose lease is gone.

Every node reaps: an incarnation listed in ``hf:nodes`` whose lease key has expired
has died (or lapsed and rejoined under a new token), and its unconfirmed deliveries
go back to the head of their queues (``RECLAIM``), so survivors redeliver them. A
lease key expires ``lease + grace`` after its last renewal, so a dead node's
deliveries are back within about ``lease + grace + beat`` seconds (5 s with the
default 3 s lease). Reclaiming is idempotent: two survivors reaping the same
incarnation move each message once (the script empties the delivery set as it
moves it), and a reclaim cut off half way is finished by the next pass, because the
incarnation stays listed until everything of it is gone: its queue set, deliveries,
consumer and handle counts, lease and mark.
"""

from __future__ import annotations

import logging
from typing import Any

from holdfast.broker.redis.keys import NODES, QueueKeys, lease_key, mark_key, node_queues
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.scripts import reclaim

log = logging.getLogger(__name__)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Reaper:
    """Finds dead incarnations and puts their deliveries back."""

    def __init__(self, registry: RedisRegistry) -> None:
        self._registry = registry
        self.reclaimed = 0
        """Deliveries of dead incarnations this node put back."""

    async def reap(self) -> None:
        """One pass: reclaim every listed incarnation but this node's whose lease is
        gone (two round trips however many there are, then one per queue of each dead
        one)."""
        registry = self._registry
        client = registry.client
        listed = [
            _text(raw) for raw in await client.call("node list", lambda: client.redis.hkeys(NODES))
        ]
        others = [incarnation for incarnation in listed if incarnation != registry.node_id]
        if not others:
            return

        async def leases() -> list[Any]:
            pipe = client.redis.pipeline(transaction=False)
            for incarnation in others:
                pipe.exists(lease_key(incarnation))
            result: list[Any] = await pipe.execute()
            return result

        alive = await client.call("leases", leases)
        for incarnation, exists in zip(others, alive, strict=True):
            if not int(exists):
                moved = await self.reclaim(incarnation)
                log.warning(
                    "node incarnation %s is gone: %d of its deliveries put back", incarnation, moved
                )

    async def reclaim(self, incarnation: str) -> int:
        """Put back every delivery of ``incarnation`` and remove its keys (also this
        node's own: at stop, and for the incarnation whose lease lapsed)."""
        registry = self._registry
        client = registry.client
        redis = client.redis
        # Its lease first: whatever it still sends is refused from here on.
        await client.call("end lease", lambda: redis.delete(lease_key(incarnation)))
        queues = await client.call("node queues", lambda: redis.smembers(node_queues(incarnation)))
        moved = 0
        for raw in queues:
            uri = _text(raw)
            back = int(await client.run(reclaim(QueueKeys(uri), node=incarnation)))
            moved += back
            await registry.settle(uri, back)
            # Its moves to dead-letter queues, unfinished, are finished now.
            await registry.graveyard.finish_stale(uri, age=0)
            registry.wake(uri)
        await client.call("forget node", lambda: redis.delete(node_queues(incarnation)))
        await client.call("forget node", lambda: redis.delete(mark_key(incarnation)))
        await client.call("forget node", lambda: redis.hdel(NODES, incarnation))
        self.reclaimed += moved
        return moved


__all__ = ["Reaper"]

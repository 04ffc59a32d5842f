"""The timed rules of the Redis store: reject delays that are over, the queue TTL and
pickup deadlines (``x-ttl-ms``).

Every node sweeps, and the scripts are atomic, so two nodes sweeping one queue move
each message once. Often (every ``FAST`` seconds) a node visits the queues whose
policy sets a TTL and those where it delayed a reject or PUT a pickup deadline
itself; every ``FULL`` seconds it visits the queues it has open (up to ``FULL_BATCH``
of them, in turn), which releases what a node that died had delayed and finishes
the dead-letter moves left unfinished. A queue no live node has opened since is swept
when one does; until then nothing delivers from it either.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from holdfast.broker.redis import policy_scripts
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.policies import ttl_cutoff_ms
from holdfast.broker.redis.queues import parse_message
from holdfast.broker.redis.script import rows
from holdfast.broker.redis.takes import EXPIRING
from holdfast.broker.store import StoreError
from holdfast.proto.policy import REASON_EXPIRED

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

FAST = 0.1
"""Seconds between sweeps of the queues with timed work: the granularity of reject
delays and TTLs, as on the other stores."""

FULL = 1.0
"""Seconds between the passes over the queues this node has open."""

FULL_BATCH = 500
"""Most open queues one such pass visits; the next goes on from there. A node with
many open queues (keyed worker pools open thousands) visits each every
``FULL * N / FULL_BATCH`` seconds instead of making three Redis calls per queue
every second."""

EXPIRE_BATCH = 256
"""Most messages one sweep of one queue expires (the next sweep takes more)."""


class Sweeper:
    """Runs the timed rules for one node's registry."""

    def __init__(self, registry: RedisRegistry) -> None:
        self._registry = registry
        self._last_full = 0
        self._cursor = 0

    async def sweep(self) -> None:
        """One pass (``StoreError`` from a queue is logged, and the pass goes on)."""
        registry = self._registry
        now = registry.now_ms()
        uris = set(registry.policies.with_ttl())
        uris.update(q.uri for q in registry if q.policy.ttl is not None)
        for uri, until in list(registry.timed.items()):
            uris.add(uri)
            if until + FULL * 1000 < now:
                del registry.timed[uri]
        visited: set[str] = set()
        if now - self._last_full >= FULL * 1000:
            self._last_full = now
            await registry.owed.pay(registry)  # give-backs that failed (``owed``)
            visited = self._next_slice()
            uris.update(visited)
        for uri in sorted(uris):
            try:
                await self._sweep(uri, now)
                if uri in visited:
                    await registry.graveyard.finish_stale(uri)
            except StoreError as error:
                log.warning("%s: sweeping failed: %s", uri, error)

    def _next_slice(self) -> set[str]:
        """The next ``FULL_BATCH`` open queues, in turn."""
        everything = sorted(q.uri for q in self._registry)
        if len(everything) <= FULL_BATCH:
            self._cursor = 0
            return set(everything)
        start = self._cursor % len(everything)
        chosen = everything[start : start + FULL_BATCH]
        chosen += everything[: FULL_BATCH - len(chosen)]
        self._cursor = start + FULL_BATCH
        return set(chosen)

    async def _sweep(self, uri: str, now: int) -> None:
        registry = self._registry
        client = registry.client
        keys = QueueKeys(uri)
        released = int(await client.run(policy_scripts.release(keys, now_ms=now)))
        if released:
            await registry.settle(uri, released)
            registry.wake(uri)
        ttl = registry.policies.effective(uri).ttl
        cutoff = ttl_cutoff_ms(now, ttl)
        await registry.remember_queue(uri)
        raw = await registry.takes.run(
            client,
            uri,
            EXPIRING,
            lambda token: policy_scripts.expire(
                keys,
                node=registry.node_id,
                lease=registry.lease(keys),
                now_ms=now,
                cutoff_ms=cutoff,
                most=EXPIRE_BATCH,
                token=token,
            ),
        )
        if raw:
            dead = [(parse_message(uri, *row), REASON_EXPIRED) for row in rows(raw, 4)]
            queue = registry.get(uri)
            if queue is not None:
                queue.dead[REASON_EXPIRED] += len(dead)
            registry.graveyard.bury(uri, dead)


__all__ = ["EXPIRE_BATCH", "FAST", "FULL", "FULL_BATCH", "Sweeper"]

"""Delivery after durability (``--redis-min-replicas N``).

With N set, the PUT script stores new messages in the queue's ``unsynced`` list
instead of its ready list, and the PUT's pipeline ends with ``WAIT N``. When N
replicas confirm, the messages (and everything stored before them, since
replication keeps Redis's order) move to the ready list (``PROMOTE``) and are ACKed
SUCCESS. When too few confirm in time the PUTs are ACKed UNKNOWN and the messages
wait: every node checks the queues whose ``unsynced`` list is not empty (one write,
then ``WAIT``, on one connection) and promotes what replicas have by then. So a
message is delivered only once N replicas hold it; one whose primary failed before
that is never delivered, and its producer was told UNKNOWN. A node without N (nodes
restarted without ``--redis-min-replicas``) promotes what it finds waiting at once:
nothing else would ever deliver it. ``PROMOTE`` goes by GUID, so nodes checking one
queue together move each message once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from holdfast.broker.redis import put_scripts
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.store import StoreError

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

SYNCED_TTL_MS = 60_000
"""TTL of the key the check writes (it only gives ``WAIT`` a write to vouch for)."""


async def promote(registry: RedisRegistry, uri: str, guid: bytes) -> int:
    """``guid`` is on enough replicas: it and what was stored before it become ready."""
    moved = int(await registry.client.run(put_scripts.promote(QueueKeys(uri), guid=guid)))
    if moved:
        registry.wake(uri)
    return moved


async def check(registry: RedisRegistry, uri: str) -> int:
    """Promote what replicas hold of ``uri``'s unsynced messages now; returns how many
    became ready. The queue stays listed for the next check while any wait."""
    client = registry.client
    keys = QueueKeys(uri)
    timeout_ms = round(client.replica_timeout * 1000)

    async def tail_then_wait() -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        pipe.lindex(keys.unsynced, -1)
        pipe.set(keys.synced, 1, px=SYNCED_TTL_MS)
        pipe.execute_command("WAIT", client.min_replicas, timeout_ms)
        result: list[Any] = await pipe.execute()
        return result

    if client.min_replicas:
        last, _, acked = await client.call("WAIT replicas", tail_then_wait)
    else:
        # Left by nodes that ran with --redis-min-replicas: this one waits for no
        # replica, so what is there is deliverable now (no WAIT: an ACL may lack it).
        last = await client.call("LINDEX", lambda: client.redis.lindex(keys.unsynced, -1))
        acked = 0
    if last is None:
        registry.unsynced.discard(uri)
        return 0
    if int(acked) < client.min_replicas:
        return 0
    moved = await promote(registry, uri, last)
    remaining = await client.call("LLEN", lambda: client.redis.llen(keys.unsynced))
    if not int(remaining):
        registry.unsynced.discard(uri)
    return moved


async def published(registry: RedisRegistry, uri: str) -> None:
    """Rows a staged commit published (one script, not a PUT): the node notes the
    queue's write sequence (``losses``), makes them deliverable once replicas have them,
    and wakes the consumers."""
    client = registry.client
    key = QueueKeys(uri).seq
    try:
        seq = await client.call("GET seq", lambda: client.redis.get(key))
        registry.seqs.saw(uri, int(seq or 0))
        if client.min_replicas:
            registry.unsynced.add(uri)
            await check(registry, uri)
    except StoreError as error:  # every node's durability check goes on
        log.warning("%s: after a staged commit: %s", uri, error)
    registry.wake(uri)


async def check_all(registry: RedisRegistry) -> None:
    """One check of every queue known to hold unsynced messages, side by side."""
    uris = list(registry.unsynced)
    if not uris:
        return
    results = await asyncio.gather(*(check(registry, uri) for uri in uris), return_exceptions=True)
    for uri, result in zip(uris, results, strict=True):
        if isinstance(result, StoreError):
            log.warning("%s: durability check: %s", uri, result)
        elif isinstance(result, BaseException):
            log.error("%s: durability check failed", uri, exc_info=result)
        elif result:
            log.info("%s: %d messages reached the replicas late; now deliverable", uri, result)


__all__ = ["SYNCED_TTL_MS", "check", "check_all", "promote", "published"]

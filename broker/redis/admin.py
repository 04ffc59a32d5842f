"""The admin service's work on the Redis store (``admin.AdminBackend``): every answer
and change is Redis's, so any node answers for all of them.

Counters are kept per queue in Redis (``hf:{uri}:stats``), so statistics cover every
node. A queue exists while it is listed in ``hf:queues`` (a node lists it when it
opens it, PUTs to it or moves a message into it) or holds messages. A delete is
refused while any node has a handle on the queue; it removes the queue's messages,
counters and policy (the GUID history keys expire with their window, so a replay of
a PUT from before the delete is still recognised until then). The queue's write
sequence stays for two hours (``losses.DELETED_SEQ_TTL``): the nodes that wrote the
queue read it back for an hour, and a gone one would read as Redis gone back in time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from holdfast.broker.admin import peeked
from holdfast.broker.redis import admin_scripts
from holdfast.broker.redis.keys import FORGET, NODES, QUEUES, QueueKeys
from holdfast.broker.redis.queues import parse_message
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.script import ScriptCall, rows, text
from holdfast.broker.store import StoreError
from holdfast.proto import pb
from holdfast.proto.policy import QueuePolicy, is_template
from holdfast.proto.validate import Invalid

log = logging.getLogger(__name__)


class RedisAdmin:
    """``AdminBackend`` over the queues kept in Redis."""

    def __init__(self, registry: RedisRegistry) -> None:
        self._registry = registry
        self._client = registry.client

    async def list_queues(self) -> list[pb.QueueStats]:
        """Every queue listed in ``hf:queues``, sorted by URI."""
        members = await self._call("SMEMBERS", lambda: self._client.redis.smembers(QUEUES))
        return [await self._stats(uri) for uri in sorted(text(m) for m in members)]

    async def stats(self, uri: str) -> pb.QueueStats:
        """One queue's depth, consumers, counters and policy, over every node."""
        stats = await self._stats(uri)
        if not stats.ready and not stats.unconfirmed and not stats.handles:
            await self._require_listed(uri)
        return stats

    async def peek(self, uri: str, count: int, skip: int = 0) -> list[pb.PeekedMessage]:
        """``count`` ready messages after the first ``skip``, in delivery order, left in
        place."""
        await self._require_listed(uri)
        raw = await self._run(admin_scripts.peek(QueueKeys(uri), most=count, skip=skip))
        now = self._registry.now_ms() / 1000
        return [peeked(parse_message(uri, *row), now) for row in rows(raw, 4)]

    async def purge(self, uri: str) -> int:
        """Remove the ready and delayed messages; consumers keep their unconfirmed ones."""
        await self._require_listed(uri)
        return int(await self._run(admin_scripts.purge(QueueKeys(uri))))

    async def delete(self, uri: str) -> int:
        """Delete the queue with its messages, counters and policy; ``QUEUE_IN_USE``
        while any node has it open."""
        await self._require_listed(uri)
        nodes = await self._call("HKEYS nodes", lambda: self._client.redis.hkeys(NODES))
        call = admin_scripts.delete(QueueKeys(uri), nodes=[text(node) for node in nodes])
        result = int(await self._run(call))
        if result < 0:
            raise Invalid(
                pb.STATUS_QUEUE_IN_USE,
                f"{uri} has {-result} open handles (over every node); close them before "
                "deleting it",
            )
        policies = self._registry.policies
        await policies.drop(uri)
        await self._call("SREM queues", lambda: self._client.redis.srem(QUEUES, uri))
        self._registry.forget(uri)
        await policies.announce(FORGET + uri)
        return result

    async def set_policy(self, uri: str, policy: QueuePolicy) -> None:
        """Replace the policy of a queue (listing it) or template, in Redis."""
        try:
            await self._registry.policies.set(uri, policy)
            if not is_template(uri):
                await self._registry.list_queue(uri)
        except StoreError as error:
            raise Invalid(pb.STATUS_STORE_ERROR, f"the store failed: {error}") from error

    async def get_policy(self, uri: str) -> QueuePolicy:
        """The policy in force at a queue (its own or its template's) or a template."""
        policies = self._registry.policies
        # Redis's answer, not this node's copy (which may lag another node's change).
        await self._guard(policies.refresh())
        if is_template(uri):
            policy = policies.templates.get(uri)
            if policy is None:
                raise Invalid(pb.STATUS_NOT_FOUND, f"no template {uri} on this store")
            return policy
        await self._require_listed(uri)
        return policies.effective(uri)

    async def replay(self, uri: str, may_write: Callable[[str], bool]) -> tuple[int, list[str]]:
        """Move every ready message of a dead-letter queue back to its original queue,
        if ``may_write`` its domain."""
        await self._require_listed(uri)
        try:
            return await self._registry.graveyard.replay(uri, may_write)
        except StoreError as error:
            raise Invalid(
                pb.STATUS_STORE_ERROR,
                f"the store failed: {error}; what did not move stays in the dead-letter queue",
            ) from error

    async def _stats(self, uri: str) -> pb.QueueStats:
        raw = await self._run(admin_scripts.stats(QueueKeys(uri)))
        ready, delayed, total, size, consumers, handles, head = (int(v) for v in raw[:7])
        counters = {text(name): int(value) for name, value in rows(raw[7:], 2)}
        dead = {name[5:]: n for name, n in counters.items() if name.startswith("dead:")}
        now = self._registry.now_ms()
        return pb.QueueStats(
            uri=uri,
            ready=ready + delayed,
            unconfirmed=max(0, total - ready - delayed),
            bytes=size,
            consumers=consumers,
            handles=handles,
            oldest_age_seconds=0.0 if head < 0 else max(0.0, (now - head) / 1000),
            accepted=counters.get("accepted", 0),
            redelivered=counters.get("redelivered", 0),
            rejected=counters.get("rejected", 0),
            dead_lettered=sum(dead.values()),
            expired=dead.get("expired", 0),
            policy=self._registry.policies.effective(uri).to_wire(),
        )

    async def _require_listed(self, uri: str) -> None:
        listed = await self._call("SISMEMBER", lambda: self._client.redis.sismember(QUEUES, uri))
        if not listed:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue {uri} on this store")

    async def _run(self, call: ScriptCall) -> Any:
        return await self._guard(self._client.run(call))

    async def _call(self, what: str, make: Any) -> Any:
        return await self._guard(self._client.call(what, make))

    @staticmethod
    async def _guard(work: Any) -> Any:
        try:
            return await work
        except StoreError as error:
            log.error("admin: %s", error)
            raise Invalid(pb.STATUS_STORE_ERROR, f"the store failed: {error}") from error


__all__ = ["RedisAdmin"]

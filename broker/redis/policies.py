"""Queue policies on the Redis store: one hash (``hf:policies``) shared by every node.

Each node keeps a copy in memory, because the PUT path and every delivery consult
the policy in force and a Redis round trip each would cost as much as the work
itself. The copy is read at start, after every change this node makes, when another
node announces a change (``hf:changed``, pub/sub) and at every heartbeat (pub/sub
loses messages): another node's change is in force here within one heartbeat, at
once in the usual case. The limits that must hold exactly (depth) are checked by
the PUT script against Redis's own counts; only which limits apply comes from here.
"""

from __future__ import annotations

import logging

from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.keys import CHANGED, POLICIES, POLICIES_CHANGED
from holdfast.proto.policy import NO_POLICY, QueuePolicy, is_template, template_matches

log = logging.getLogger(__name__)


class PolicyBook:
    """This node's copy of every queue's and template's policy."""

    def __init__(self, client: RedisClient) -> None:
        self._client = client
        self.own: dict[str, QueuePolicy] = {}
        """Policies set on queues, by URI."""
        self.templates: dict[str, QueuePolicy] = {}
        """Policy templates (``hf://<domain>/<prefix>*``)."""

    def effective(self, uri: str) -> QueuePolicy:
        """The policy in force at the queue ``uri``: its own, else its longest template's."""
        own = self.own.get(uri)
        if own is not None:
            return own
        best, found = -1, NO_POLICY
        for template, policy in self.templates.items():
            if len(template) > best and template_matches(template, uri):
                best, found = len(template), policy
        return found

    def with_ttl(self) -> list[str]:
        """Queues whose own policy sets a TTL (every node sweeps them)."""
        return [uri for uri, policy in self.own.items() if policy.ttl is not None]

    async def refresh(self) -> None:
        """Read every policy from Redis (``StoreError`` if it cannot be reached)."""
        redis = self._client.redis
        raw = await self._client.call("HGETALL policies", lambda: redis.hgetall(POLICIES))
        own: dict[str, QueuePolicy] = {}
        templates: dict[str, QueuePolicy] = {}
        for key, value in raw.items():
            uri = key.decode() if isinstance(key, bytes) else str(key)
            text = value.decode() if isinstance(value, bytes) else str(value)
            try:
                policy = QueuePolicy.from_json(text)
            except ValueError as error:
                # Kept out rather than guessed at; the operator sees why.
                log.error("ignoring the policy of %s kept in Redis: %s", uri, error)
                continue
            (templates if is_template(uri) else own)[uri] = policy
        self.own, self.templates = own, templates

    async def set(self, uri: str, policy: QueuePolicy) -> None:
        """Set (or with an empty policy clear) the policy of a queue or template, in
        Redis first, then here, then tell the other nodes. Raises ``Invalid`` for a
        policy that cannot work, ``StoreError`` if Redis did not take it."""
        policy.check_for(uri)
        redis = self._client.redis
        if policy.empty:
            await self._client.call("HDEL policy", lambda: redis.hdel(POLICIES, uri))
            (self.templates if is_template(uri) else self.own).pop(uri, None)
        else:
            text = policy.to_json()
            await self._client.call("HSET policy", lambda: redis.hset(POLICIES, uri, text))
            (self.templates if is_template(uri) else self.own)[uri] = policy
        await self.announce(POLICIES_CHANGED)

    async def drop(self, uri: str) -> None:
        """Remove the policy of a deleted queue (Redis and here)."""
        redis = self._client.redis
        await self._client.call("HDEL policy", lambda: redis.hdel(POLICIES, uri))
        self.own.pop(uri, None)

    async def announce(self, what: str) -> None:
        """Publish ``what`` on ``hf:changed`` (the other nodes refresh or forget)."""
        redis = self._client.redis
        await self._client.call("PUBLISH changed", lambda: redis.publish(CHANGED, what))


def ttl_cutoff_ms(now_ms: int, ttl: float | None) -> int:
    """The acceptance time (ms) at or before which a message is past ``ttl`` at
    ``now_ms``: what the CLAIM, SETTLE and EXPIRE scripts compare with (0: no TTL).
    ``lifecycle.expired`` says the same in seconds; this is its form for the scripts."""
    return now_ms - round(ttl * 1000) if ttl is not None else 0


__all__ = ["PolicyBook", "ttl_cutoff_ms"]

"""Dead letters on the Redis store: burying messages and replaying them.

The same rules as ``broker.deadletter`` (the copies are built by its ``dead_copies``
and ``replay_copy``, so dead letters look the same on every store). A move is two
scripts (``policy_scripts``): ``ADD`` into each target queue, guarded by a marker
per move, then ``CONFIRM`` out of the source. Until the second ran, the message is
one of this node's deliveries: if the node dies it is reclaimed into its source and
buried again, and the marker makes that second ``ADD`` a no-op. If Redis fails
meanwhile, the messages go back to the head of their source (logged).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from holdfast.broker.deadletter import dead_copies, replay_copy, replayable
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.queues import message_meta, parse_message
from holdfast.broker.store import StoredMessage, StoreError
from holdfast.proto.policy import ORIGINAL_URI

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

Move = tuple[StoredMessage, str]
"""A copy to add to its queue, and the id of the move that makes it."""


class RedisGraveyard:
    """Buries messages for every queue of the node, and replays dead-letter queues."""

    def __init__(self, registry: RedisRegistry, marker_ttl_ms: int) -> None:
        self._registry = registry
        self._marker_ttl_ms = marker_ttl_ms
        self.dropped: Counter[str] = Counter()
        """Dead messages dropped because their queue has no dead-letter queue, by reason."""
        self.moved: Counter[str] = Counter()
        """Dead messages moved to a dead-letter queue, by reason."""

    def bury(self, uri: str, dead: list[tuple[StoredMessage, str]]) -> None:
        """Move ``dead`` (this node's deliveries of ``uri``) to the dead-letter queue,
        or drop them, in the background."""
        self._registry.spawn(self._bury(uri, dead))

    async def _bury(self, uri: str, dead: list[tuple[StoredMessage, str]]) -> None:
        registry = self._registry
        target = registry.policies.effective(uri).dead_letter
        now = registry.now_ms() / 1000
        moves: list[Move] = []
        for message, reason in dead:
            for copy in dead_copies(message, reason, uri, target, now):
                moves.append((copy, _move_id(copy, uri, message)))
        guids = [message.guid for message, _ in dead]
        try:
            await self._add(moves)
            await registry.remove(uri, guids)
        except StoreError as error:
            log.error("%s: moving %d dead messages failed; they stay: %s", uri, len(dead), error)
            await registry.requeue(uri, guids)
            return
        reasons = Counter(reason for _, reason in dead)
        for reason, n in reasons.items():
            (self.moved if target is not None else self.dropped)[reason] += n
            registry.count(uri, "dead:" + reason, n)
        if target is None:
            log.warning(
                "%s: dropped %d dead messages (%s): the queue has no dead-letter queue",
                uri,
                len(dead),
                ", ".join(sorted(reasons)),
            )

    async def replay(self, uri: str) -> tuple[int, list[str]]:
        """Move every ready (and delayed) message of the dead-letter queue ``uri`` back
        to its ``x-original-uri``. Returns how many moved and the problems of those
        left in place; raises ``StoreError`` if Redis failed (what did not move stays
        in the dead-letter queue)."""
        registry = self._registry
        keys = QueueKeys(uri)
        node = registry.node_id
        await registry.remember_queue(uri)
        raw = await registry.client.run(
            "TAKE",
            [keys.ready, keys.delayed, keys.body, keys.meta, keys.count, keys.out(node)],
            [registry.now_ms()],
        )
        taken = [parse_message(uri, *raw[i : i + 4]) for i in range(0, len(raw), 4)]
        moving = [message for message in taken if replayable(message)]
        stay = [message for message in taken if not replayable(message)]
        problems = [f"{m.guid.hex()}: no valid {ORIGINAL_URI}" for m in stay]
        if stay:
            await registry.requeue(uri, [message.guid for message in stay])
        if not moving:
            return 0, problems
        now = registry.now_ms() / 1000
        moves = [(copy, _move_id(copy, uri, m)) for m in moving for copy in [replay_copy(m, now)]]
        try:
            await self._add(moves)
            await registry.remove(uri, [message.guid for message in moving])
        except StoreError:
            await registry.requeue(uri, [message.guid for message in moving])
            raise
        return len(moving), problems

    async def _add(self, moves: list[Move]) -> None:
        registry = self._registry
        by_target: dict[str, list[Move]] = {}
        for move in moves:
            by_target.setdefault(move[0].queue_uri, []).append(move)
        for target, items in by_target.items():
            keys = QueueKeys(target)
            await registry.list_queue(target)
            args: list[object] = [keys.moves, self._marker_ttl_ms]
            for copy, move_id in items:
                args += [copy.guid, move_id, message_meta(copy), copy.payload]
            await registry.client.run(
                "ADD", [keys.ready, keys.body, keys.meta, keys.count, keys.bytes], args
            )
            registry.wake(target)


def _move_id(copy: StoredMessage, source: str, original: StoredMessage) -> str:
    """One id per move: the copy's GUID, where it came from and when the original was
    accepted there (a message that comes back and dies again moves again)."""
    return f"{copy.guid.hex()}:{round(original.accepted_at * 1000)}:{source}"


__all__ = ["RedisGraveyard"]

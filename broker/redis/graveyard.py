"""Dead letters on the Redis store: burying messages and replaying them.

The same rules as ``broker.deadletter`` (the copies are built by its ``dead_copies``
and ``replay_copy``, so dead letters look the same on every store). A move is three
scripts (``policy_scripts``): the message *leaves* its source (no longer delivered,
and no longer this node's: it survives the node), ``ADD`` puts the copies in their
targets, guarded by a marker per move, and ``GONE`` removes the source's copy. A
move that did not finish (the node died, Redis failed) is finished by whichever
node sweeps the queue after ``STALE`` seconds, or at once by the node that reaps a
dead one; finishing it twice adds nothing twice.
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

REPLAY = "replay"
"""The reason of a move out of a dead-letter queue back to the original queue."""

STALE = 5.0
"""Seconds after which any node finishes a move that its node did not."""

Leaving = tuple[StoredMessage, str, str | None]
"""A message on its way out: (message, reason, dead-letter queue or None)."""


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
        keys = QueueKeys(uri)
        target = registry.policies.effective(uri).dead_letter
        args: list[object] = [registry.now_ms()]
        for message, reason in dead:
            args += [message.guid, f"{reason}|{target or ''}"]
        try:
            await registry.client.run(
                "LEAVE", [keys.out(registry.node_id), keys.leaving, registry.lease(keys)], args
            )
        except StoreError as error:
            log.error("%s: %d dead messages stay for now: %s", uri, len(dead), error)
            await registry.requeue(uri, [message.guid for message, _ in dead])
            return
        await self._finish(uri, [(message, reason, target) for message, reason in dead])

    async def finish_stale(self, uri: str, age: float = STALE) -> int:
        """Finish the moves out of ``uri`` begun ``age`` seconds ago or more (by this
        node or one that died); returns how many. ``StoreError`` if Redis fails."""
        registry = self._registry
        keys = QueueKeys(uri)
        since = registry.now_ms() - round(age * 1000)
        raw = await registry.client.run(
            "LEAVING", [keys.leaving, keys.body, keys.meta, keys.count], [since]
        )
        items: list[Leaving] = []
        for i in range(0, len(raw), 5):
            reason, _, target = _text(raw[i + 4]).partition("|")
            items.append((parse_message(uri, *raw[i : i + 4]), reason, target or None))
        if items:
            log.warning("%s: finishing %d moves another node began", uri, len(items))
            await self._finish(uri, items)
        return len(items)

    async def replay(self, uri: str) -> tuple[int, list[str]]:
        """Move every ready (and delayed) message of the dead-letter queue ``uri`` back
        to its ``x-original-uri``. Returns how many moved and the problems of those
        left in place; raises ``StoreError`` if Redis failed (moves begun are finished
        by a later sweep, the rest stays in the dead-letter queue)."""
        registry = self._registry
        keys = QueueKeys(uri)
        raw = await registry.client.run(
            "TAKE",
            [keys.ready, keys.delayed, keys.body, keys.meta, keys.count, keys.leaving],
            [registry.now_ms()],
        )
        taken = [parse_message(uri, *raw[i : i + 4]) for i in range(0, len(raw), 4)]
        moving = [message for message in taken if replayable(message)]
        stay = [message for message in taken if not replayable(message)]
        if stay:
            await registry.client.run(
                "STAY", [keys.leaving, keys.ready], [message.guid for message in stay]
            )
        if moving and not await self._finish(uri, [(m, REPLAY, None) for m in moving]):
            raise StoreError(f"{len(moving)} replays of {uri} were begun and not finished")
        return len(moving), [f"{m.guid.hex()}: no valid {ORIGINAL_URI}" for m in stay]

    async def _finish(self, uri: str, items: list[Leaving]) -> bool:
        """ADD the copies of messages leaving ``uri``, then remove them from it. Says
        whether that worked (if not, a later sweep finishes the moves)."""
        registry = self._registry
        keys = QueueKeys(uri)
        now = registry.now_ms() / 1000
        moves: list[tuple[StoredMessage, str]] = []
        for message, reason, target in items:
            if reason == REPLAY:
                copies = [replay_copy(message, now)]
            else:
                copies = dead_copies(message, reason, uri, target, now)
            moves += [(copy, _move_id(copy, uri, message)) for copy in copies]
        try:
            await self._add(moves)
            await registry.client.run(
                "GONE",
                [keys.body, keys.meta, keys.count, keys.leaving, keys.bytes, keys.pickup],
                [message.guid for message, _, _ in items],
            )
        except StoreError as error:
            log.error("%s: %d moves out wait for a later sweep: %s", uri, len(items), error)
            return False
        dead = Counter((reason, target) for _, reason, target in items if reason != REPLAY)
        for (reason, target), n in dead.items():
            (self.moved if target is not None else self.dropped)[reason] += n
            registry.count(uri, "dead:" + reason, n)
            if target is None:
                log.warning(
                    "%s: dropped %d dead messages (%s): the queue has no dead-letter queue",
                    uri,
                    n,
                    reason,
                )
        return True

    async def _add(self, moves: list[tuple[StoredMessage, str]]) -> None:
        registry = self._registry
        by_target: dict[str, list[tuple[StoredMessage, str]]] = {}
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


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


__all__ = ["REPLAY", "STALE", "RedisGraveyard"]

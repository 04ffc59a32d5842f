"""Dead letters on the Redis store: burying messages and replaying them.

The same rules as ``broker.deadletter`` (the copies are built by its ``dead_copies``
and ``replay_copy``, so dead letters look the same on every store). A move is three
scripts (``move_scripts``): the message *leaves* its source (no longer delivered,
and no longer this node's: it survives the node), ``ADD`` puts the copies in their
targets, guarded by a marker per move (renaming a dead letter whose GUID its target
holds, leaving out a replay whose GUID its target holds: ``broker.moved_guids``), and
``GONE`` removes the source's copy (``STAY`` puts a replay left out back). A
move that did not finish (the node died, Redis failed) is finished by whichever
node sweeps the queue after ``STALE`` seconds, or at once by the node that reaps a
dead one (every unfinished move of the queue, another node's in flight too). Finishing
it twice adds nothing twice and counts it once: ``GONE`` counts a dead letter in the
queue's statistics in the one run that removes the source's copy.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from holdfast.broker.deadletter import dead_copies, replay_copy, replay_problem
from holdfast.broker.moved_guids import held_problem, own_dead_letter, renamed
from holdfast.broker.redis import move_scripts
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.queues import message_meta, parse_message, pickup_deadline_ms
from holdfast.broker.redis.script import rows, text
from holdfast.broker.store import StoredMessage, StoreError

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

REPLAY = "replay"
"""The reason of a move out of a dead-letter queue back to the original queue."""

STALE = 5.0
"""Seconds after which any node finishes a move that its node did not."""


class Leaving(NamedTuple):
    """A message on its way out of its queue."""

    message: StoredMessage
    reason: str
    """``x-death-reason``, or ``REPLAY``."""
    target: str | None
    """The dead-letter queue (None: dropped; a replay's target is in the message)."""


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
        target = own_dead_letter(uri, registry.policies.effective(uri).dead_letter)
        try:
            await registry.client.run(
                move_scripts.leave(
                    keys,
                    node=registry.node_id,
                    lease=registry.lease(keys),
                    now_ms=registry.now_ms(),
                    leaving=[(message.guid, reason, target) for message, reason in dead],
                )
            )
        except StoreError as error:
            log.error("%s: %d dead messages stay for now: %s", uri, len(dead), error)
            await registry.requeue(uri, [message.guid for message, _ in dead])
            return
        await self._finish(uri, [Leaving(message, reason, target) for message, reason in dead])

    async def finish_stale(self, uri: str, age: float = STALE) -> int:
        """Finish the moves out of ``uri`` begun ``age`` seconds ago or more (by this
        node or one that died); returns how many. ``StoreError`` if Redis fails."""
        registry = self._registry
        keys = QueueKeys(uri)
        since = registry.now_ms() - round(age * 1000)
        raw = await registry.client.run(move_scripts.leaving(keys, since_ms=since))
        items: list[Leaving] = []
        for guid, payload, meta, count, where in rows(raw, 5):
            reason, _, target = text(where).partition("|")
            message = parse_message(uri, guid, payload, meta, count)
            items.append(Leaving(message, reason, target or None))
        if items:
            log.warning("%s: finishing %d moves another node began", uri, len(items))
            await self._finish(uri, items)
        return len(items)

    async def replay(self, uri: str, may_write: Callable[[str], bool]) -> tuple[int, list[str]]:
        """Move every ready (and delayed) message of the dead-letter queue ``uri`` back
        to its ``x-original-uri`` (if ``may_write`` its domain). Returns how many moved
        and the problems of those left in place; raises ``StoreError`` if Redis failed
        (moves begun are finished by a later sweep, the rest stays in the dead-letter
        queue)."""
        registry = self._registry
        keys = QueueKeys(uri)
        raw = await registry.client.run(move_scripts.take(keys, now_ms=registry.now_ms()))
        taken = [parse_message(uri, *row) for row in rows(raw, 4)]
        problems = [(message, replay_problem(message, may_write)) for message in taken]
        moving = [message for message, problem in problems if problem is None]
        stay = [message for message, problem in problems if problem is not None]
        if stay:
            await registry.client.run(
                move_scripts.stay(keys, guids=[message.guid for message in stay])
            )
        held: list[str] = []
        if moving:
            held_out = await self._finish(uri, [Leaving(m, REPLAY, None) for m in moving])
            if held_out is None:
                raise StoreError(f"{len(moving)} replays of {uri} were begun and not finished")
            held = held_out
        left = [problem for _, problem in problems if problem is not None]
        return len(moving) - len(held), left + held

    async def _finish(self, uri: str, items: list[Leaving]) -> list[str] | None:
        """ADD the copies of messages leaving ``uri``, then remove them from it (a
        replay whose GUID its target holds stays, back at the head). Returns why each
        of those stayed, or None if Redis failed (a later sweep finishes the moves)."""
        registry = self._registry
        keys = QueueKeys(uri)
        now = registry.now_ms() / 1000
        moves: list[tuple[StoredMessage, move_scripts.Move]] = []
        owners: list[Leaving] = []
        for item in items:
            message, reason, target = item
            if reason == REPLAY:
                copies = [replay_copy(message, now)]
            else:
                copies = dead_copies(message, reason, uri, target, now)
            moves += [(copy, _move(copy, uri, message, reason)) for copy in copies]
            owners += [item] * len(copies)
        try:
            statuses = await self._add(moves)
            stay = [m for m, s in zip(owners, statuses, strict=True) if s == move_scripts.HELD]
            went = set(
                await registry.client.run(
                    move_scripts.gone(keys, guids=[m.message.guid for m in items if m not in stay])
                )
            )
            if stay:
                await registry.client.run(
                    move_scripts.stay(keys, guids=[m.message.guid for m in stay])
                )
        except StoreError as error:
            log.error("%s: %d moves out wait for a later sweep: %s", uri, len(items), error)
            return None
        # Counted for the moves this node finished (GONE counts them in the queue's
        # statistics): another node may finish the same ones.
        dead = Counter(
            (reason, target)
            for message, reason, target in items
            if reason != REPLAY and message.guid in went
        )
        for (reason, target), n in dead.items():
            (self.moved if target is not None else self.dropped)[reason] += n
            if target is None:
                log.warning(
                    "%s: dropped %d dead messages (%s): the queue has no dead-letter queue",
                    uri,
                    n,
                    reason,
                )
        return [held_problem(m.message, replay_copy(m.message, now)) for m in stay]

    async def _add(self, moves: list[tuple[StoredMessage, move_scripts.Move]]) -> list[int]:
        """ADD each copy to its queue; each copy's ``ADD`` status, in order."""
        registry = self._registry
        by_target: dict[str, list[int]] = {}
        for index, (copy, _) in enumerate(moves):
            by_target.setdefault(copy.queue_uri, []).append(index)
        statuses = [0] * len(moves)
        for target, indexes in by_target.items():
            await registry.list_queue(target)
            raw = await registry.client.run(
                move_scripts.add(
                    QueueKeys(target),
                    marker_ttl_ms=self._marker_ttl_ms,
                    moves=[moves[index][1] for index in indexes],
                )
            )
            for index, (status, _) in zip(indexes, rows(raw, 2), strict=True):
                statuses[index] = int(status)
            if pickup := max(moves[index][1].pickup_ms for index in indexes):
                # Swept until then, as after a PUT with a pickup deadline (``sweep``).
                registry.timed[target] = max(registry.timed.get(target, 0), pickup)
            registry.wake(target)
        return statuses


def _move(
    copy: StoredMessage, source: str, original: StoredMessage, reason: str
) -> move_scripts.Move:
    """The ``ADD`` stride of ``copy``. One id per move: the copy's GUID, where it came
    from and when the original was accepted there (a message that comes back and dies
    again moves again). A replay's copy is left out where its GUID is held; any other
    is renamed there (``moved_guids``)."""
    move_id = f"{copy.guid.hex()}:{round(original.accepted_at * 1000)}:{source}"
    mode = move_scripts.KEEP_OUT if reason == REPLAY else move_scripts.RENAME
    return move_scripts.Move(
        copy.guid,
        move_id,
        message_meta(copy),
        copy.payload,
        mode,
        source,
        message_meta(renamed(copy, copy.guid)),
        pickup_deadline_ms(copy),
    )


__all__ = ["REPLAY", "STALE", "Leaving", "RedisGraveyard"]

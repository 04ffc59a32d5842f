"""Moving messages to dead-letter queues, and back.

A message a queue must not deliver again (past its delivery limit or TTL, or
rejected without requeue) is *buried*: if the queue's policy names a dead-letter
queue, it moves there with the properties ``x-death-reason``, ``x-original-uri`` and
``x-delivery-count``, under the same GUID (so a caller can still correlate it, and
``dlq replay`` can put it back under that GUID); otherwise it is dropped and counted.

A move is one store batch: the removal from the source and the new copy in the
dead-letter queue commit together, so a crash (even a kill -9) leaves the message in
exactly one of the two. The copy is enqueued only once that batch is durable; if
the write fails the message goes back to the front of its source queue.

A dead-letter queue's own depth limit does not refuse a move (the message would
have nowhere to go); its TTL and delivery limit apply to what it holds as usual.

A message that carries ``x-dead-letter-notify`` (a queue URI; request/reply sets it
to the caller's reply queue) also sends a *notice* there in the same batch: an empty
message under ``dead_letter_notice_guid(guid)`` with ``x-death-reason``,
``x-original-uri``, ``x-delivery-count`` and ``x-dead-guid`` (osrdyne's dead-letter
responder, done by the broker so that it works when no worker is alive).

Copies are built with the dead message's digest so that replays of the original PUT
keep being recognised; notices have none (nobody PUTs them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from holdfast.broker.store import MessageKey, Store, StoreBatch, StoredMessage, settle
from holdfast.proto.policy import (
    DEAD_GUID,
    DEAD_LETTER_NOTIFY,
    DEATH_REASON,
    DELIVERY_COUNT,
    ORIGINAL_URI,
    PICKUP_TTL,
    dead_letter_notice_guid,
)
from holdfast.proto.validate import Invalid, parse_queue_uri

if TYPE_CHECKING:
    from holdfast.broker.queues import Queue

log = logging.getLogger(__name__)

_SPENT = frozenset((PICKUP_TTL, DEAD_LETTER_NOTIFY))


def _anywhere(domain: str) -> bool:
    return True


DEATH_PROPERTIES = (DEATH_REASON, ORIGINAL_URI, DELIVERY_COUNT)
"""The properties a move to a dead-letter queue adds (and a replay removes)."""


class Graveyard:
    """Buries messages for every queue of a broker (``queues.Graveyard``)."""

    def __init__(
        self, store: Store, open_queue: Callable[[str], Queue], clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._open = open_queue
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped: Counter[str] = Counter()
        """Dead messages dropped because their queue has no dead-letter queue, by reason."""
        self.moved: Counter[str] = Counter()
        """Dead messages moved to a dead-letter queue, by reason."""

    def bury(self, queue: Queue, dead: list[tuple[StoredMessage, str]]) -> None:
        """Move ``dead`` out of ``queue`` (see the module docstring), and send the notice
        of each that asks for one (``x-dead-letter-notify``)."""
        target_uri = queue.policy.dead_letter
        batch = StoreBatch(removed=[MessageKey(queue.uri, m.guid) for m, _ in dead])
        now = self._clock()
        copies: list[StoredMessage] = []
        for message, reason in dead:
            copies.extend(dead_copies(message, reason, queue.uri, target_uri, now))
            if target_uri is not None:
                self.moved[reason] += 1
            else:
                self.dropped[reason] += 1
        if target_uri is None:
            log.warning(
                "%s: dropped %d dead messages (%s): the queue has no dead-letter queue",
                queue.uri,
                len(dead),
                ", ".join(sorted({reason for _, reason in dead})),
            )
        if not copies:
            for message, _ in dead:
                queue.forget(message)
            self._write_quietly(batch)
            return
        batch.messages = copies
        self._move(queue, [m for m, _ in dead], copies, batch)

    def replay(
        self, dead_letters: Queue, may_write: Callable[[str], bool] = _anywhere
    ) -> tuple[list[StoredMessage], list[str]]:
        """Take every ready message of a dead-letter queue and start moving each back to
        its ``x-original-uri`` (under its GUID, its delivery count reset, the death
        properties removed). Returns the messages moving and the problems of those
        left in place (no or a bad ``x-original-uri``, or one in a domain that
        ``may_write`` refuses: the replaying token's); ``wait`` for the move."""
        taken = dead_letters.take_ready()
        moving: list[StoredMessage] = []
        stay: list[StoredMessage] = []
        problems: list[str] = []
        for message in taken:
            problem = replay_problem(message, may_write)
            if problem is None:
                moving.append(message)
            else:
                stay.append(message)
                problems.append(problem)
        if stay:
            dead_letters.requeue_front(stay)
        now = self._clock()
        by_target: dict[str, list[tuple[StoredMessage, StoredMessage]]] = {}
        for message in moving:
            copy = replay_copy(message, now)
            origin = copy.queue_uri
            by_target.setdefault(origin, []).append((message, copy))
        for pairs in by_target.values():
            originals = [m for m, _ in pairs]
            batch = StoreBatch(
                messages=[c for _, c in pairs],
                removed=[MessageKey(dead_letters.uri, m.guid) for m in originals],
            )
            self._move(dead_letters, originals, [c for _, c in pairs], batch)
        return moving, problems

    async def wait(self) -> None:
        """Wait until every move in progress has settled."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _move(
        self,
        source: Queue,
        originals: list[StoredMessage],
        copies: list[StoredMessage],
        batch: StoreBatch,
    ) -> None:
        # Out of the source at once, so nothing delivers or moves them twice meanwhile.
        for message in originals:
            source.forget(message)
        try:
            result = self._store.write(batch)
        except Exception:
            log.exception("%s: the store refused a dead-letter move", source.uri)
            self._undo(source, originals)
            return
        task = asyncio.get_running_loop().create_task(
            self._finish(result, source, originals, copies)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(
        self,
        result: Awaitable[None],
        source: Queue,
        originals: list[StoredMessage],
        copies: list[StoredMessage],
    ) -> None:
        try:
            await settle(result)
        except Exception:
            log.exception(
                "%s: moving %d messages out failed; they stay in %s",
                source.uri,
                len(originals),
                source.uri,
            )
            self._undo(source, originals)
            return
        targets: dict[str, Queue] = {}
        for copy in copies:
            target = targets.get(copy.queue_uri)
            if target is None:
                target = targets[copy.queue_uri] = self._open(copy.queue_uri)
            if copy.guid not in target.live:
                target.add(copy)
        for target in targets.values():
            target.deliver()

    @staticmethod
    def _undo(source: Queue, originals: list[StoredMessage]) -> None:
        for message in originals:
            source.live[message.guid] = message
            source.live_bytes += len(message.payload)
        source.requeue_front(originals)

    def _write_quietly(self, batch: StoreBatch) -> None:
        """Write a batch of removals whose failure only means the messages come back
        after a restart (logged, like a failed confirmation)."""
        try:
            result = self._store.write(batch)
        except Exception:
            log.exception("the store refused to record dropped dead messages")
            return
        task = asyncio.get_running_loop().create_task(self._settle_quietly(result))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _settle_quietly(result: Awaitable[None]) -> None:
        try:
            await settle(result)
        except Exception:
            log.exception("the store failed to record dropped dead messages")


def dead_copies(
    message: StoredMessage, reason: str, source_uri: str, target_uri: str | None, now: float
) -> list[StoredMessage]:
    """What burying ``message`` creates: its copy in ``target_uri`` (none without a
    dead-letter queue) and the notice its ``x-dead-letter-notify`` asks for (if any).
    Shared by every store's graveyard, so dead letters look the same everywhere."""
    death = {
        DEATH_REASON: reason,
        ORIGINAL_URI: source_uri,
        DELIVERY_COUNT: str(message.delivery_count),
    }
    copies: list[StoredMessage] = []
    if target_uri is not None:
        # The per-message rules did their job: a dead letter must not expire from the
        # dead-letter queue, nor notify again.
        properties = {k: v for k, v in message.properties.items() if k not in _SPENT} | death
        copies.append(
            StoredMessage(
                target_uri, message.guid, message.payload, properties, now, 0, message.digest
            )
        )
    notify = message.properties.get(DEAD_LETTER_NOTIFY) if message.properties else None
    if notify is not None:
        death[DEAD_GUID] = message.guid.hex()
        copies.append(StoredMessage(notify, dead_letter_notice_guid(message.guid), b"", death, now))
    return copies


def replay_problem(
    message: StoredMessage, may_write: Callable[[str], bool] = _anywhere
) -> str | None:
    """Why a dead letter cannot go back to its ``x-original-uri`` (none or an invalid
    one, or a domain ``may_write`` refuses), or None."""
    origin = message.properties.get(ORIGINAL_URI)
    try:
        domain = parse_queue_uri(origin).domain
    except Invalid:
        return f"{message.guid.hex()}: no valid {ORIGINAL_URI}"
    if not may_write(domain):
        return f"{message.guid.hex()}: the token may not write domain {domain!r} ({origin})"
    return None


def replay_copy(message: StoredMessage, now: float) -> StoredMessage:
    """A dead letter as it goes back to its ``x-original-uri`` (check ``replay_problem``
    first): same GUID and digest, delivery count reset, death properties removed."""
    properties = {k: v for k, v in message.properties.items() if k not in DEATH_PROPERTIES}
    return StoredMessage(
        message.properties[ORIGINAL_URI],
        message.guid,
        message.payload,
        properties,
        now,
        0,
        message.digest,
    )


__all__ = ["DEATH_PROPERTIES", "Graveyard", "dead_copies", "replay_copy", "replay_problem"]

"""Moving messages to dead-letter queues, and back.

A message a queue must not deliver again (past its delivery limit or TTL, or
rejected without requeue) is *buried*: if the queue's policy names a dead-letter
queue, it moves there with the properties ``x-death-reason``, ``x-original-uri`` and
``x-delivery-count``, under the same GUID (so a caller can still correlate it, and
``dlq replay`` can put it back under that GUID); otherwise it is dropped and counted.
A dead letter dead-lettered again (its dead-letter queue's own policy dead-letters)
keeps ``x-original-uri`` and ``x-original-guid``, the queue it first died in and its
GUID there (``first_origin``); ``x-death-reason`` and ``x-delivery-count`` tell of
the last move.
A policy that makes a queue its own dead-letter queue (refused when set, but a store
may hold one from before) counts as none: the move would replace the message by
itself.

The dead-letter queue may already hold the GUID: then the copy is renamed
(``moved_guids``). Every copy being moved in counts as held (``Queue.in_flight``)
until its write settles, so two moves (or a PUT) racing for one GUID see each other.
A replay goes back under ``x-original-guid`` (else the GUID); one whose original
queue holds that GUID stays in the dead-letter queue, reported.

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
responder, done by the broker so that it works when no worker is alive). The notice
carries a pickup TTL (``x-ttl-ms``, ``notice_ttl_ms``): a caller that is gone never
reads it, and it would keep its queue in the broker for good.

Copies are built with the dead message's digest so that replays of the original PUT
keep being recognised; notices have none (nobody PUTs them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from holdfast.broker.moved_guids import held_problem, original_guid, own_dead_letter, unique_copy
from holdfast.broker.store import MessageKey, Store, StoreBatch, StoredMessage, settle
from holdfast.proto.policy import (
    DEAD_GUID,
    DEAD_LETTER_NOTIFY,
    DEATH_REASON,
    DELIVERY_COUNT,
    ORIGINAL_GUID,
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


NOTICE_MIN_TTL_MS = 10_000
"""The shortest pickup TTL of a dead-letter notice: room for its caller to reconnect."""
NOTICE_DEFAULT_TTL_MS = 3_600_000
"""The pickup TTL of the notice of a message that had none of its own."""

DEATH_PROPERTIES = (DEATH_REASON, ORIGINAL_URI, DELIVERY_COUNT, ORIGINAL_GUID)
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
        target_uri = own_dead_letter(queue.uri, queue.policy.dead_letter)
        batch = StoreBatch(removed=[MessageKey(queue.uri, m.guid) for m, _ in dead])
        now = self._clock()
        copies: list[StoredMessage] = []
        for message, reason in dead:
            for copy in dead_copies(message, reason, queue.uri, target_uri, now):
                target = self._open(copy.queue_uri)
                copies.append(unique_copy(copy, queue.uri, partial(_holds, target)))
                _reserve(target, copies[-1])
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
        now = self._clock()
        by_target: dict[str, list[tuple[StoredMessage, StoredMessage]]] = {}
        for message in taken:
            problem = replay_problem(message, may_write)
            if problem is None:
                copy = replay_copy(message, now)
                target = self._open(copy.queue_uri)
                if _holds(target, copy.guid):
                    # Under that GUID it would replace (or be replaced by) a live message.
                    problem = held_problem(message, copy)
                else:
                    _reserve(target, copy)
                    moving.append(message)
                    by_target.setdefault(copy.queue_uri, []).append((message, copy))
            if problem is not None:
                stay.append(message)
                problems.append(problem)
        if stay:
            dead_letters.requeue_front(stay)
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
            self._settle_copies(copies, False)
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
            self._settle_copies(copies, False)
            self._undo(source, originals)
            return
        targets = self._settle_copies(copies, True)
        for copy in copies:
            target = targets[copy.queue_uri]
            if copy.guid in target.live:  # pragma: no cover - in_flight kept it unique
                log.error("%s: a moved message's GUID is taken; it stays in the store", copy)
                continue
            target.add(copy)
        for target in targets.values():
            target.deliver()

    def _settle_copies(self, copies: list[StoredMessage], durable: bool) -> dict[str, Queue]:
        """The write of ``copies`` settled: they no longer hold their GUIDs in flight
        (a PUT waiting on one is told ``durable``). Returns their queues by URI."""
        targets: dict[str, Queue] = {}
        for copy in copies:
            target = targets.get(copy.queue_uri)
            if target is None:
                target = targets[copy.queue_uri] = self._open(copy.queue_uri)
            entry = target.in_flight.pop(copy.guid, None)
            if entry is not None:
                target.in_flight_bytes -= len(copy.payload)
                if not entry[0].done():
                    entry[0].set_result(durable)
        return targets

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


def _holds(queue: Queue, guid: bytes) -> bool:
    """Whether ``queue`` holds ``guid``: a live message, or one being written (a PUT or
    a move in flight)."""
    return guid in queue.in_flight or guid in queue.live


def _reserve(queue: Queue, copy: StoredMessage) -> None:
    """Hold ``copy``'s GUID in ``queue`` while its move is written: a PUT of it waits
    for the move's outcome (a duplicate, or a CONFLICT), and a racing move renames."""
    queue.in_flight[copy.guid] = (asyncio.get_running_loop().create_future(), copy.digest)
    queue.in_flight_bytes += len(copy.payload)


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
        origin = first_origin(message)
        if origin is None:  # its first death: its GUID there is its own
            properties.pop(ORIGINAL_GUID, None)
        else:  # dead-lettered again: the pair names where it first died, and its GUID there
            properties[ORIGINAL_URI] = origin
        copies.append(
            StoredMessage(
                target_uri, message.guid, message.payload, properties, now, 0, message.digest
            )
        )
    notify = message.properties.get(DEAD_LETTER_NOTIFY) if message.properties else None
    if notify is not None:
        death[DEAD_GUID] = message.guid.hex()
        death[PICKUP_TTL] = str(notice_ttl_ms(message.properties))
        copies.append(StoredMessage(notify, dead_letter_notice_guid(message.guid), b"", death, now))
    return copies


def first_origin(message: StoredMessage) -> str | None:
    """The queue a dead letter first died in, if it is one being dead-lettered again
    (out of a dead-letter queue whose own policy dead-letters): its valid
    ``x-original-uri``; None for a message dying for the first time. A replay puts a
    dead letter back there (under ``x-original-guid``), not in a dead-letter queue."""
    properties = message.properties
    # Both marks of a move: a client's PUT may name a queue it can write as its
    # x-original-uri, which alone does not make the message a dead letter.
    if not properties or DEATH_REASON not in properties:
        return None
    origin = properties.get(ORIGINAL_URI)
    if origin is None:
        return None
    try:
        parse_queue_uri(origin)
    except Invalid:
        return None
    return origin


def notice_ttl_ms(properties: Mapping[str, str]) -> int:
    """The pickup TTL of the dead-letter notice of a message with ``properties``: the
    message's own (``x-ttl-ms``: whoever waits for the notice waited that long for
    the message's pickup; a durable request's is its reply's keep time), at least
    ``NOTICE_MIN_TTL_MS``; ``NOTICE_DEFAULT_TTL_MS`` without one."""
    ttl = properties.get(PICKUP_TTL, "")
    if not ttl.isdigit():
        return NOTICE_DEFAULT_TTL_MS
    return max(int(ttl), NOTICE_MIN_TTL_MS)


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
    if original_guid(message) is None:
        return f"{message.guid.hex()}: no valid {ORIGINAL_GUID}"
    if not may_write(domain):
        return f"{message.guid.hex()}: the token may not write domain {domain!r} ({origin})"
    return None


def replay_copy(message: StoredMessage, now: float) -> StoredMessage:
    """A dead letter as it goes back to its ``x-original-uri`` (check ``replay_problem``
    first): its original GUID (``original_guid``) and digest, delivery count reset,
    death properties removed."""
    properties = {k: v for k, v in message.properties.items() if k not in DEATH_PROPERTIES}
    guid = original_guid(message)
    assert guid is not None, "replay_problem refuses a bad x-original-guid"
    return StoredMessage(
        message.properties[ORIGINAL_URI],
        guid,
        message.payload,
        properties,
        now,
        0,
        message.digest,
    )


__all__ = [
    "DEATH_PROPERTIES",
    "NOTICE_DEFAULT_TTL_MS",
    "NOTICE_MIN_TTL_MS",
    "Graveyard",
    "dead_copies",
    "first_origin",
    "notice_ttl_ms",
    "replay_copy",
    "replay_problem",
]

"""The broker's message lifecycle, as data: one table that every store obeys.

A message a queue accepted is in one of six states, and only the events in its row of
``TRANSITIONS`` move it. ``apply`` is the whole rulebook as one pure function (the shape
of RabbitMQ's quorum queue, ``rabbit_fifo``: one ``apply`` over commands); an event a
state does not accept raises ``IllegalTransition`` (as h11's ``_state.py`` does)::

                put                     deliver (count + 1)
    (accepted) ─────▶ READY ───────────────────────────────────▶ HELD ──confirm──▶ CONFIRMED
                        ▲  │ tick: past TTL / pickup missed        │ │ │
                        │  └──────────────▶ DEAD(expired)          │ │ └─reject──▶ DEAD(rejected)
                        │  deliver: spent / TTL / pickup ──▶ DEAD  │ └─delay──▶ DELAYED ─due─┐
                        └──── release (requeue, session lost, node lost), due ◀──────────────┘
                              (spent ──▶ DEAD(delivery-limit), past TTL ──▶ DEAD(expired))
    READY, DELAYED ──purge──▶ PURGED        HELD: tick and purge leave it held
    STAGED ──commit──▶ READY    STAGED ──discard / tick past its deadline──▶ DISCARDED

**Staged** rows (transactional writes, ``staging``) are kept apart under (application,
version, partition, attempt), invisible to consumers and purge; the writer's commit
publishes the attempts it names (as PUTs, decided by ``admit``), discards the others;
an abort discards all; the sweep discards (logs, counts) one past its deadline.

The guards, each decided in one place:

* **delivery limit** (``spent``): a message already delivered ``max_deliveries`` times is
  never delivered again; it is dead-lettered ``delivery-limit`` when it would be: at its
  next delivery or when it is released. So it is delivered exactly ``max_deliveries``
  times, then dead-lettered once.
* **TTL** (``expired``), RabbitMQ's rule: counted from acceptance (broker clock). A ready
  or released message past its TTL is dead-lettered ``expired``; a message a consumer
  holds does not expire while held (tick and purge leave it), and is dead-lettered
  ``expired`` when it is released after its TTL instead of being redelivered. A delayed
  message is checked when its delay is over.
* **pickup TTL** (``x-ttl-ms``, ``pickup_missed``): a message never delivered by its
  pickup deadline is dead-lettered ``expired``, by the sweep or at its delivery,
  whichever comes first (request/reply: nobody picked it up, so it never runs).

``admit`` decides a PUT in the same way: a replay of a known GUID (its message still
lives, or the history holds it) is a DUPLICATE if the content matches and a CONFLICT if
not; an unknown GUID older than the window is TOO_OLD; then the queue's depth limit and
the history's bound refuse it; else it is accepted (and becomes READY once durable).

Memory and sqlite run this module (``queues.Queue`` calls ``before_delivery``,
``expired``, ``pickup_missed`` and ``release``; ``puts`` calls ``admit``); Redis calls
``release`` where it gives a message back, its scripts take the limit and the TTL
cutoff from the same policy, and a walk holds them to every row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from holdfast.proto.policy import REASON_DELIVERY_LIMIT, REASON_EXPIRED, REASON_REJECTED


class State(Enum):
    """Where a message is."""

    READY = "ready"
    """In the queue, waiting for a consumer with room."""
    HELD = "held"
    """Delivered to a consumer, not yet settled."""
    DELAYED = "delayed"
    """Rejected with requeue and a delay: back to READY when the delay is over."""
    CONFIRMED = "confirmed"
    """Settled by its consumer: gone."""
    DEAD = "dead"
    """Gone to the dead-letter queue (or dropped and counted), with a reason."""
    PURGED = "purged"
    """Removed by an operator's purge."""
    STAGED = "staged"
    """Written by a transactional writer's task, not yet committed: no consumer sees it."""
    DISCARDED = "discarded"
    """Staged, never published: aborted, another attempt won, or expired."""


TERMINAL = frozenset((State.CONFIRMED, State.DEAD, State.PURGED, State.DISCARDED))
"""States no event leaves."""


class Event(Enum):
    """What can happen to a message."""

    DELIVER = "deliver"
    """A consumer has room and the message is next."""
    CONFIRM = "confirm"
    """Its consumer confirms it."""
    REJECT = "reject"
    """Its consumer rejects it without requeue."""
    REQUEUE = "requeue"
    """Its consumer rejects it with requeue and no delay."""
    DELAY = "delay"
    """Its consumer rejects it with requeue and a delay."""
    DUE = "due"
    """Its reject delay is over."""
    SESSION_LOST = "session-lost"
    """Its consumer's session closed or dropped."""
    NODE_LOST = "node-lost"
    """The broker node that delivered it is gone (Redis: its liveness key expired)."""
    TICK = "tick"
    """The clock moved: the sweep looks at TTLs and pickup deadlines."""
    PURGE = "purge"
    """An operator purges the queue."""
    COMMIT = "commit"
    """The writer's driver committed the staged attempt this row belongs to."""
    DISCARD = "discard"
    """The writer aborted, or committed another attempt of its partition."""


class Guard(Enum):
    """The condition a row needs, checked in the order the rows of a cell are listed."""

    ALWAYS = "always"
    SPENT = "spent"
    """Delivered ``max_deliveries`` times already (``spent``)."""
    EXPIRED = "expired"
    """Past the queue's TTL (``expired``)."""
    PICKUP_MISSED = "pickup-missed"
    """Never delivered, and its pickup deadline passed (``pickup_missed``)."""
    STAGE_EXPIRED = "stage-expired"
    """Staged, and its staging deadline passed (``stage_expired``)."""


class Effect(Enum):
    """What the store does besides changing the state."""

    NONE = "none"
    PUSH = "push"
    """Count one more delivery (durably, before the PUSH leaves) and PUSH it."""
    REMOVE = "remove"
    """Remove it from the queue (confirm, purge)."""
    BURY = "bury"
    """Move it to the dead-letter queue with ``reason`` (or drop and count it)."""
    FRONT = "front"
    """Put it back at the front of the queue, in its original order."""
    HOLD_BACK = "hold-back"
    """Keep it aside until its delay is over."""
    PUBLISH = "publish"
    """Put a staged row into its queue (as a PUT, decided by ``admit``)."""
    DROP = "drop"
    """Forget a staged row (an expiry is logged and counted)."""


@dataclass(frozen=True, slots=True)
class Row:
    """In ``state``, on ``event``, if ``guard``: to ``target``, with ``effect`` (``reason``)."""

    state: State
    event: Event
    guard: Guard
    target: State
    effect: Effect
    reason: str | None = None


_S, _E, _G, _F = State, Event, Guard, Effect
_RELEASE_ROWS = (
    (_G.SPENT, _S.DEAD, _F.BURY, REASON_DELIVERY_LIMIT),
    (_G.EXPIRED, _S.DEAD, _F.BURY, REASON_EXPIRED),
    (_G.ALWAYS, _S.READY, _F.FRONT, None),
)
"""What a release does, whatever released it: spent first, then TTL, else ready."""

TRANSITIONS: tuple[Row, ...] = (
    Row(_S.READY, _E.DELIVER, _G.SPENT, _S.DEAD, _F.BURY, REASON_DELIVERY_LIMIT),
    Row(_S.READY, _E.DELIVER, _G.EXPIRED, _S.DEAD, _F.BURY, REASON_EXPIRED),
    Row(_S.READY, _E.DELIVER, _G.PICKUP_MISSED, _S.DEAD, _F.BURY, REASON_EXPIRED),
    Row(_S.READY, _E.DELIVER, _G.ALWAYS, _S.HELD, _F.PUSH),
    Row(_S.READY, _E.TICK, _G.EXPIRED, _S.DEAD, _F.BURY, REASON_EXPIRED),
    Row(_S.READY, _E.TICK, _G.PICKUP_MISSED, _S.DEAD, _F.BURY, REASON_EXPIRED),
    Row(_S.READY, _E.TICK, _G.ALWAYS, _S.READY, _F.NONE),
    Row(_S.READY, _E.PURGE, _G.ALWAYS, _S.PURGED, _F.REMOVE),
    Row(_S.HELD, _E.CONFIRM, _G.ALWAYS, _S.CONFIRMED, _F.REMOVE),
    Row(_S.HELD, _E.REJECT, _G.ALWAYS, _S.DEAD, _F.BURY, REASON_REJECTED),
    Row(_S.HELD, _E.DELAY, _G.ALWAYS, _S.DELAYED, _F.HOLD_BACK),
    *(
        Row(_S.HELD, event, guard, target, effect, reason)
        for event in (_E.REQUEUE, _E.SESSION_LOST, _E.NODE_LOST)
        for guard, target, effect, reason in _RELEASE_ROWS
    ),
    Row(_S.HELD, _E.TICK, _G.ALWAYS, _S.HELD, _F.NONE),
    Row(_S.HELD, _E.PURGE, _G.ALWAYS, _S.HELD, _F.NONE),
    *(
        Row(_S.DELAYED, _E.DUE, guard, target, effect, reason)
        for guard, target, effect, reason in _RELEASE_ROWS
    ),
    Row(_S.DELAYED, _E.TICK, _G.ALWAYS, _S.DELAYED, _F.NONE),
    Row(_S.DELAYED, _E.PURGE, _G.ALWAYS, _S.PURGED, _F.REMOVE),
    Row(_S.STAGED, _E.COMMIT, _G.ALWAYS, _S.READY, _F.PUBLISH),
    Row(_S.STAGED, _E.DISCARD, _G.ALWAYS, _S.DISCARDED, _F.DROP),
    Row(_S.STAGED, _E.TICK, _G.STAGE_EXPIRED, _S.DISCARDED, _F.DROP),
    Row(_S.STAGED, _E.TICK, _G.ALWAYS, _S.STAGED, _F.NONE),
    Row(_S.STAGED, _E.PURGE, _G.ALWAYS, _S.STAGED, _F.NONE),
)
"""Every legal transition; a cell's rows are tried in order, its last is ``ALWAYS``."""

RELEASES = frozenset((_E.REQUEUE, _E.SESSION_LOST, _E.NODE_LOST, _E.DUE))
"""The events that give a message back to the queue (``release``)."""


class IllegalTransition(Exception):
    """An event the message's state does not accept (a bug in the caller: a confirm of a
    message nobody holds is refused before it gets here)."""

    def __init__(self, state: State, event: Event) -> None:
        super().__init__(f"a {state.value} message cannot take {event.value!r}")
        self.state = state
        self.event = event


class Policy(Protocol):
    """The parts of a queue's policy the lifecycle reads: ``QueuePolicy`` is one."""

    @property
    def max_deliveries(self) -> int | None:
        """Deliveries after which a message is dead-lettered ``delivery-limit``."""
        ...

    @property
    def ttl(self) -> float | None:
        """Seconds after acceptance after which a message is dead-lettered ``expired``."""
        ...


@dataclass(frozen=True, slots=True)
class Rules:
    """A ``Policy`` of its own, for models and tests."""

    max_deliveries: int | None = None
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """The lifecycle's view of one message."""

    state: State
    delivery_count: int = 0
    accepted_at: float = 0.0
    pickup_deadline: float | None = None
    """Broker-clock time by which it must first be delivered (``x-ttl-ms``), if any."""
    reason: str | None = None
    """Why it is DEAD."""
    stage_deadline: float | None = None
    """Broker-clock time after which a STAGED row is discarded, if any."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``apply`` did: the row taken and the message after it."""

    row: Row
    message: Message


def spent(delivery_count: int, max_deliveries: int | None) -> bool:
    """Whether a message delivered ``delivery_count`` times may not be delivered again:
    the one place the delivery limit is decided."""
    return max_deliveries is not None and delivery_count >= max_deliveries


def expired(accepted_at: float, now: float, ttl: float | None) -> bool:
    """Whether a message accepted at ``accepted_at`` is past the queue's TTL at ``now``:
    the one place TTL is decided (counted from acceptance, RabbitMQ's rule)."""
    return ttl is not None and now - accepted_at >= ttl


def pickup_missed(delivery_count: int, deadline: float | None, now: float) -> bool:
    """Whether a never-delivered message's pickup deadline (``x-ttl-ms``) has passed."""
    return deadline is not None and delivery_count == 0 and now >= deadline


def stage_expired(deadline: float | None, now: float) -> bool:
    """Whether a staged row's deadline has passed (the one place this is decided)."""
    return deadline is not None and now >= deadline


def holds(guard: Guard, message: Message, now: float, rules: Policy) -> bool:
    """Whether ``guard`` holds for ``message`` at ``now`` under ``rules``."""
    if guard is Guard.ALWAYS:
        return True
    if guard is Guard.SPENT:
        return spent(message.delivery_count, rules.max_deliveries)
    if guard is Guard.EXPIRED:
        return expired(message.accepted_at, now, rules.ttl)
    if guard is Guard.STAGE_EXPIRED:
        return stage_expired(message.stage_deadline, now)
    return pickup_missed(message.delivery_count, message.pickup_deadline, now)


_CELLS: dict[tuple[State, Event], tuple[Row, ...]] = {}
for _row in TRANSITIONS:
    _CELLS[(_row.state, _row.event)] = (*_CELLS.get((_row.state, _row.event), ()), _row)


def rows(state: State, event: Event) -> tuple[Row, ...]:
    """The rows of one cell, in the order they are tried; raises ``IllegalTransition``
    if the state does not take the event."""
    cell = _CELLS.get((state, event))
    if cell is None:
        raise IllegalTransition(state, event)
    return cell


def apply(message: Message, event: Event, now: float, rules: Policy) -> Outcome:
    """The whole rulebook: the row ``event`` takes ``message`` through, and the message
    after it. Pure: nothing is changed in place."""
    for row in rows(message.state, event):
        if holds(row.guard, message, now, rules):
            count = message.delivery_count + (row.effect is Effect.PUSH)
            return Outcome(
                row, replace(message, state=row.target, delivery_count=count, reason=row.reason)
            )
    raise AssertionError(f"no ALWAYS row ends the cell {message.state}/{event}")  # pragma: no cover


def release(delivery_count: int, accepted_at: float, now: float, rules: Policy) -> str | None:
    """A message given back (requeue, session or node lost, delay over): ``None`` if it
    goes back to the front of the queue, else the reason it is dead-lettered instead.
    The stores' hot paths call this rather than ``apply``; a test checks they agree."""
    if spent(delivery_count, rules.max_deliveries):
        return REASON_DELIVERY_LIMIT
    if expired(accepted_at, now, rules.ttl):
        return REASON_EXPIRED
    return None


def before_delivery(
    count: int, accepted_at: float, now: float, rules: Policy, pickup: float | None = None
) -> str | None:
    """A READY message about to be delivered: ``None`` to PUSH it, else the reason it is
    dead-lettered instead (a release's guards, then a missed pickup deadline)."""
    reason = release(count, accepted_at, now, rules)
    return REASON_EXPIRED if reason is None and pickup_missed(count, pickup, now) else reason


class Admission(Enum):
    """What the broker answers a PUT (``admit``)."""

    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    """A replay of a known GUID with the same content: ACKed OK, not enqueued again."""
    CONFLICT = "conflict"
    """A known GUID with other content."""
    TOO_OLD = "too-old"
    """An unknown GUID older than the announced window: the broker cannot vouch for it."""
    QUEUE_FULL = "queue-full"
    HISTORY_FULL = "history-full"


def admit(
    known_digest: int | None,
    digest: int,
    age_ms: int,
    max_age_ms: int,
    queue_full: bool,
    history_full: bool,
) -> Admission:
    """Decide a PUT, in this order: replay (DUPLICATE or CONFLICT), TOO_OLD, QUEUE_FULL,
    HISTORY_FULL, ACCEPT. ``known_digest`` is the digest of the GUID's message while it
    lives, else of its history entry, else ``None``."""
    if known_digest is not None:
        return Admission.DUPLICATE if known_digest == digest else Admission.CONFLICT
    if age_ms > max_age_ms:
        return Admission.TOO_OLD
    if queue_full:
        return Admission.QUEUE_FULL
    if history_full:
        return Admission.HISTORY_FULL
    return Admission.ACCEPT


__all__ = [
    "RELEASES",
    "TERMINAL",
    "TRANSITIONS",
    "Admission",
    "Effect",
    "Event",
    "Guard",
    "IllegalTransition",
    "Message",
    "Outcome",
    "Policy",
    "Row",
    "Rules",
    "State",
    "admit",
    "apply",
    "before_delivery",
    "expired",
    "holds",
    "pickup_missed",
    "release",
    "rows",
    "spent",
    "stage_expired",
]

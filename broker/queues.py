"""Queues, their consumers, and the session-side handles on them.

A ``Queue`` exists per URI, created the first time any session opens it. It holds
its ready messages (packed until they leave: ``ready``), the messages waiting out
a reject delay, the consumers that may receive them, its GUID history, the GUIDs whose
store write is still in flight and its policy (``policy.QueuePolicy``). Delivery is
round-robin over the consumers that have room under their message and byte limits.
A consumer's unconfirmed messages go back to the front of the queue, in their
original order, when the consumer goes away or rejects them with requeue; their
next PUSH carries the next delivery count (a PUSH leaves once that count is durable:
``updates``).

The policy is applied where a message changes hands: one past its delivery limit
or its TTL is not PUSHed but handed to the queue's ``Graveyard`` (``deadletter``),
which moves it to the dead-letter queue or drops and counts it; so is one rejected
without requeue.

Everything here is synchronous and runs on the broker's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import count, islice, repeat
from operator import attrgetter
from typing import Protocol

from holdfast.broker import delivery
from holdfast.broker.consumers import Consumer, FlowLimits, PushSink, QueueHandle
from holdfast.broker.dedup import GuidHistory
from holdfast.broker.lifecycle import before_delivery, expired, pickup_missed, release
from holdfast.broker.ready import LiveMessages, ReadyMessages
from holdfast.broker.store import StoredMessage
from holdfast.broker.updates import Updates
from holdfast.proto.policy import (
    NO_POLICY,
    REASON_EXPIRED,
    REASON_REJECTED,
    QueuePolicy,
)


class Graveyard(Protocol):
    """Where a queue sends the messages it must not deliver again (``deadletter``)."""

    def bury(self, queue: Queue, dead: list[tuple[StoredMessage, str]]) -> None:
        """Take ``(message, reason)`` pairs that already left ``queue``'s ready deque,
        consumers and delay heap (they are still in ``queue.live``)."""
        ...


_guid = attrgetter("guid")
_payload = attrgetter("payload")

_sequence = count()
"""Tie-breaker of the delay heap: equal due times keep their reject order."""


class Queue:
    """One queue: ready and delayed messages, consumers, GUID history, in-flight GUIDs
    and its policy."""

    def __init__(
        self,
        uri: str,
        history: GuidHistory,
        updates: Updates,
        graveyard: Graveyard | None = None,
        clock: Callable[[], float] | None = None,
        timed: set[Queue] | None = None,
    ) -> None:
        self.uri = uri
        objects: dict[bytes, StoredMessage] = {}
        self.ready = ReadyMessages(objects)
        self.delayed: list[tuple[float, int, StoredMessage]] = []
        """Messages rejected with a delay: a heap of (due time, order, message)."""
        self.pickups: list[tuple[float, int, bytes]] = []
        # GUIDs, not messages: one confirmed long before its deadline frees its payload.
        """Messages with a pickup TTL (``x-ttl-ms``): a heap of (deadline, order,
        message); one delivered before its deadline is skipped when it comes due."""
        self.history = history
        self.in_flight: dict[bytes, tuple[asyncio.Future[bool], int]] = {}
        """GUIDs accepted but still being written to the store -> (the future that says
        whether that write succeeded, the content digest). A PUT of such a GUID is a
        replay whose ACK must wait for the original's outcome."""
        self.in_flight_bytes = 0
        """Payload bytes of the in-flight PUTs (counted against ``max_bytes``)."""
        self.live = LiveMessages(objects, self.ready, history)
        """Every message of the queue, ready, delayed or unconfirmed, by GUID: a GUID is
        known while its message lives, whatever the window."""
        self.live_bytes = 0
        """Payload bytes of ``live``."""
        self.policy: QueuePolicy = NO_POLICY
        """The policy in force: the queue's own, or its template's."""
        self.own_policy = False
        """Whether ``policy`` was set on this queue (not inherited from a template)."""
        self.handles = 0
        """Queue handles open on it, over all sessions."""
        self._consumers: list[Consumer] = []
        self._next = 0
        self._updates = updates
        self._graveyard = graveyard
        # The registry's set of queues its sweep visits (for delayed messages).
        self._timed = timed
        self._clock = clock if clock is not None else history.clock
        # Counters read by the metrics collector and the admin service.
        self.accepted = 0
        """PUTs accepted into this queue."""
        self.pushed = 0
        """PUSHes of this queue's messages, redeliveries included."""
        self.redelivered = 0
        """PUSHes of a message delivered before."""
        self.dedup_hits = 0
        """Replayed PUTs ACKed without being enqueued again."""
        self.rejected = 0
        """Messages consumers rejected (with or without requeue)."""
        self.dead: Counter[str] = Counter()
        """Messages that left for the dead-letter queue (or were dropped), by reason."""

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """The consumers attached now, in round-robin order."""
        return tuple(self._consumers)

    @property
    def unconfirmed(self) -> int:
        """Messages delivered and not yet confirmed."""
        return sum(len(consumer.unconfirmed) for consumer in self._consumers)

    @property
    def idle(self) -> bool:
        """No handle, no message, no policy, no PUT in flight: nothing to keep but the
        history (``QueueRegistry`` drops the queue once that has expired too)."""
        return not (self.handles or self.live or self.in_flight or self.delayed or self.own_policy)

    def add(self, message: StoredMessage) -> None:
        """Append one newly accepted (already durable) message; ``deliver()`` after."""
        self.live[message.guid] = message
        self.live_bytes += len(message.payload)
        self.ready.append(message)
        # Most messages have no properties, so no pickup TTL: no call for them.
        if message.properties and (deadline := message.pickup_deadline()) is not None:
            heapq.heappush(self.pickups, (deadline, next(_sequence), message.guid))
            if self._timed is not None:
                self._timed.add(self)

    def enqueue(self, messages: Iterable[StoredMessage]) -> None:
        """Append newly accepted (already durable) messages; call ``deliver()`` after."""
        for message in messages:
            self.add(message)

    def enqueue_recorded(self, messages: list[StoredMessage]) -> None:
        """``enqueue`` messages its history has just recorded, packed (``ready``)."""
        if self.ready.pack(messages):
            self.live_bytes += sum(len(message.payload) for message in messages)
        else:
            self.enqueue(messages)

    def forget(self, message: StoredMessage) -> None:
        """``message`` left the queue for good (confirmed, purged, dead-lettered)."""
        if self.live.pop(message.guid, None) is not None:
            self.live_bytes -= len(message.payload)

    def full(self, count: int, nbytes: int) -> bool:
        """Whether ``count`` more messages of ``nbytes`` would pass the depth limit."""
        policy = self.policy
        if policy.max_messages is not None and (
            len(self.live) + len(self.in_flight) + count > policy.max_messages
        ):
            return True
        return policy.max_bytes is not None and (
            self.live_bytes + self.in_flight_bytes + nbytes > policy.max_bytes
        )

    def attach(self, consumer: Consumer) -> None:
        """Start delivering to ``consumer``."""
        if consumer not in self._consumers:
            self._consumers.append(consumer)
        self.deliver()

    def detach(self, consumer: Consumer, redeliver: bool = True) -> int:
        """Stop delivering to ``consumer``; its unconfirmed messages go back to the front
        of the queue in their original order and (unless ``redeliver`` is false, for a
        caller detaching several consumers before one ``deliver()``) are delivered
        again. Returns how many went back."""
        try:
            index = self._consumers.index(consumer)
        except ValueError:
            return 0
        del self._consumers[index]
        if index < self._next:
            self._next -= 1
        if self._next >= len(self._consumers):
            self._next = 0
        returned = list(consumer.unconfirmed.values())
        consumer.unconfirmed.clear()
        consumer.unconfirmed_bytes = 0
        if returned:
            self._return(returned)
            if redeliver:
                self.deliver()
        return len(returned)

    def confirm(self, consumer: Consumer, guid: bytes) -> bool:
        """Remove ``guid`` if ``consumer`` holds it unconfirmed; say whether it did.
        Call ``deliver()`` after a batch of confirmations."""
        return not self.confirm_run(consumer, [guid])

    def confirm_run(self, consumer: Consumer, guids: list[bytes]) -> list[bytes]:
        """``confirm`` each of ``guids`` (a ConfirmBatch's run on one handle) at once;
        the GUIDs ``consumer`` does not hold, in order. Call ``deliver()`` after."""
        taken = list(map(consumer.unconfirmed.pop, guids, repeat(None)))
        held = [message for message in taken if message is not None]
        consumer.unconfirmed_bytes -= sum(map(len, map(_payload, held)))
        confirmed = list(map(_guid, held))
        forgotten = map(self.live.objects.pop, confirmed, repeat(None))
        self.live_bytes -= sum(len(m.payload) for m in forgotten if m is not None)
        self._updates.removed_run(self.uri, confirmed)
        if len(held) == len(guids):
            return []
        return [guid for guid, message in zip(guids, taken, strict=True) if message is None]

    def reject(self, consumer: Consumer, guid: bytes, requeue: bool, delay: float) -> bool:
        """Give back ``guid`` if ``consumer`` holds it: with ``requeue`` to the front of
        the queue (after ``delay`` seconds), else to the graveyard as ``rejected``. Says
        whether the consumer held it. Call ``deliver()`` after a batch of rejects."""
        message = consumer.take(guid)
        if message is None:
            return False
        self.rejected += 1
        if not requeue:
            self._bury([(message, REASON_REJECTED)])
        elif delay > 0:
            heapq.heappush(self.delayed, (self._clock() + delay, next(_sequence), message))
            if self._timed is not None:
                self._timed.add(self)
        else:
            self._return([message])
        return True

    def release_due(self, now: float) -> int:
        """Move delayed messages whose delay is over to the front of the queue (oldest
        first) and deliver; returns how many."""
        due: list[StoredMessage] = []
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            due.append(heapq.heappop(delayed)[2])
        if due:
            self._return(due)
            self.deliver()
        return len(due)

    def expire(self, now: float) -> int:
        """Dead-letter the ready messages past the policy's TTL; returns how many.

        Never-delivered messages are in acceptance order, but a released one goes to
        the front and may be newer than those behind it: the scan steps over delivered
        ones within their TTL and stops at the first never-delivered one within it."""
        ttl = self.policy.ttl
        if ttl is None:
            return 0
        ready = self.ready
        dead: list[tuple[StoredMessage, str]] = []
        kept: list[StoredMessage] = []
        while ready:
            if expired(ready[0].accepted_at, now, ttl):
                dead.append((ready.popleft(), REASON_EXPIRED))
            elif ready[0].delivery_count > 0:
                kept.append(ready.popleft())
            else:
                break
        ready.extendleft(reversed(kept))
        if dead:
            self._bury(dead)
        return len(dead)

    def expire_pickups(self, now: float) -> int:
        """Dead-letter the messages whose pickup TTL passed before their first delivery;
        returns how many. Rare (a request nobody picked up), so a removal from the
        middle of the ready deque is affordable."""
        pickups = self.pickups
        dead: list[tuple[StoredMessage, str]] = []
        while pickups and pickups[0][0] <= now:
            message = self.live.get(heapq.heappop(pickups)[2])
            if message is None:
                continue  # gone
            # The message's own deadline: the GUID may be a newer message's by now.
            if not pickup_missed(message.delivery_count, message.pickup_deadline(), now):
                continue  # picked up in time
            try:
                self.ready.remove(message)
            except ValueError:
                continue  # not ready: taken out for a move (take_ready)
            dead.append((message, REASON_EXPIRED))
        if dead:
            self._bury(dead)
        return len(dead)

    def purge(self) -> list[StoredMessage]:
        """Remove every ready and delayed message (not those consumers hold); returns
        them for the caller to record in the store."""
        purged = self.ready.drain()
        purged.extend(entry[2] for entry in self.delayed)
        self.delayed.clear()
        self.pickups.clear()
        for message in purged:
            self.forget(message)
        return purged

    def take_ready(self) -> list[StoredMessage]:
        """Remove every ready and delayed message but keep them live (a move in
        progress: ``forget`` or ``requeue_front`` each of them after)."""
        taken = self.ready.drain()
        taken.extend(entry[2] for entry in self.delayed)
        self.delayed.clear()
        return taken

    def requeue_front(self, messages: list[StoredMessage]) -> None:
        """Put back messages whose move failed, at the front, in their order."""
        self.ready.extendleft(reversed(messages))
        self.deliver()

    def oldest_accepted_at(self) -> float | None:
        """When the oldest message still in the queue was accepted (broker clock)."""
        times = [message.accepted_at for message in islice(self.ready, 1)]
        times.extend(entry[2].accepted_at for entry in self.delayed)
        for consumer in self._consumers:
            times.extend(m.accepted_at for m in islice(consumer.unconfirmed.values(), 1))
        return min(times, default=None)

    def deliver(self) -> None:
        """PUSH ready messages round-robin to the consumers with room, until the queue
        is empty or every consumer is full (``delivery``). Messages past the delivery
        limit or the TTL go to the graveyard instead."""
        ready = self.ready
        consumers = self._consumers
        if not ready or not consumers:
            return
        policy = self.policy
        # Queues without a limit, a TTL or a pickup deadline (most) skip the guards.
        guarded = policy.max_deliveries is not None or policy.ttl is not None or bool(self.pickups)
        dead: list[tuple[StoredMessage, str]] = []
        if len(consumers) == 1 and not guarded:
            pushed, again = delivery.to_one(ready, consumers[0], self.uri, self._updates)
        else:
            guard = self._guard() if guarded else None
            self._next, pushed, again, dead = delivery.round_robin(
                ready, consumers, self._next, self.uri, self._updates, guard
            )
        self.pushed += pushed
        self.redelivered += again
        if dead:
            self._bury(dead)

    def _guard(self) -> delivery.Guard:
        """The lifecycle's check before a PUSH (``lifecycle.before_delivery``), now."""
        now, policy, pickups = self._clock(), self.policy, self.pickups

        def guard(message: StoredMessage) -> str | None:
            pickup = message.pickup_deadline() if pickups else None
            return before_delivery(message.delivery_count, message.accepted_at, now, policy, pickup)

        return guard

    def _return(self, messages: list[StoredMessage]) -> None:
        """Messages given back go to the front in their order; those the lifecycle
        dead-letters on release (spent, or past the TTL) go to the graveyard at once
        instead of waiting for a consumer."""
        policy = self.policy
        if policy.max_deliveries is not None or policy.ttl is not None:
            now = self._clock()
            back: list[StoredMessage] = []
            dead: list[tuple[StoredMessage, str]] = []
            for message in messages:
                reason = release(message.delivery_count, message.accepted_at, now, policy)
                if reason is None:
                    back.append(message)
                else:
                    dead.append((message, reason))
            if dead:
                self._bury(dead)
            messages = back
        self.ready.extendleft(reversed(messages))

    def _bury(self, dead: list[tuple[StoredMessage, str]]) -> None:
        for _, reason in dead:
            self.dead[reason] += 1
        if self._graveyard is None:
            # Only a queue built without a registry (unit tests) has none: drop.
            for message, _ in dead:
                self.forget(message)
                self._updates.removed(self.uri, message.guid)
            return
        self._graveyard.bury(self, dead)


__all__ = ["Consumer", "FlowLimits", "Graveyard", "PushSink", "Queue", "QueueHandle", "Updates"]

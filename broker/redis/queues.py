"""Queues on Redis, as the broker's sessions see them.

The session code is the same as for the in-memory queues: it opens a queue, attaches
consumers, confirms, rejects and detaches; the PUT path takes PutBatch frames. Here
a queue's messages live in Redis (``keys``) and each node holds only what it
delivered to its own consumers (``Consumer.unconfirmed``, as in memory):

- delivery is pull: while local consumers have room, the node claims that many
  messages (``CLAIM``: one atomic move from the ready list to the node's deliveries,
  counting the delivery) and PUSHes them round-robin to its consumers. Nodes claim
  only for consumers with room, so flow limits hold across nodes and work spreads
  over every node's consumers; a claimed message no consumer can take any more (it
  left while the claim was on its way) goes back as never claimed (``UNCLAIM``), and
  the next claim waits until it is back at the head; a claim judges whether Redis went
  back by what the node had seen before sending it (replies on other connections may
  overtake its own); a claim whose reply was lost is sent again under its token and
  answers what it took, never more (``takes``);
- the policy applies where a message changes hands, as in memory: ``CLAIM`` hands
  back, uncounted, a message past its delivery limit, the queue's TTL or its pickup
  deadline, and the node buries it (``graveyard``); so is one rejected without
  requeue;
- a CONFIRM is taken off the consumer at once and written to Redis in one batch per
  turn of the loop (retried through an outage); a REJECT with requeue, or a consumer
  that leaves, puts its messages back at the head (``REQUEUE``), after its delay if
  it has one (``DELAY``; the sweep releases it); a give-back Redis did not take is
  owed, tried again by the sweep, and nothing is claimed past it (``owed``);
- when a node dies its deliveries are reclaimed by the survivors (``nodes``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import TYPE_CHECKING

from holdfast.broker.consumers import Consumer
from holdfast.broker.lifecycle import release
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.policies import ttl_cutoff_ms
from holdfast.broker.redis.script import rows, text
from holdfast.broker.redis.scripts import Claimed, Unclaimed, claim, unclaim
from holdfast.broker.redis.takes import CLAIMING
from holdfast.broker.store import NO_PROPERTIES, StoredMessage, StoreError
from holdfast.proto.policy import PICKUP_TTL, REASON_REJECTED, QueuePolicy
from holdfast.server import spans

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

CLAIM_BATCH = 256
"""Most messages one claim takes."""


class RedisQueue:
    """One queue: the local consumers of this node, and its Redis keys."""

    def __init__(self, uri: str, registry: RedisRegistry) -> None:
        self.uri = uri
        self.keys = QueueKeys(uri)
        self._registry = registry
        self._consumers: list[Consumer] = []
        self._next = 0
        self._claiming = False
        self._returning = 0
        """Give-backs on their way to the head of the queue: no claim until they are
        there, or a claim sent on another connection could overtake them."""
        self._handles = 0
        self.remote_consumers = 0
        """Consumers attached on the other nodes (refreshed by the heartbeat)."""
        # Counters of the metrics collector (the in-memory queue's names), this node's.
        self.accepted = self.pushed = self.redelivered = self.dedup_hits = self.rejected = 0
        self.dead: Counter[str] = Counter()
        self.ready = RemoteDepth()
        """Ready messages in Redis, as of the last heartbeat (for the metrics)."""
        self.live_bytes = 0
        """Payload bytes of the queue in Redis, as of the last heartbeat."""

    @property
    def policy(self) -> QueuePolicy:
        """The policy in force (the node's copy of ``hf:policies``)."""
        return self._registry.policies.effective(self.uri)

    @property
    def handles(self) -> int:
        """Queue handles open on this node; every node publishes its count, so that a
        delete anywhere is refused while any node has the queue open."""
        return self._handles

    @handles.setter
    def handles(self, value: int) -> None:
        self._handles = value
        self._registry.handles_changed(self)
        self._registry.release(self)

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """The consumers attached on this node."""
        return tuple(self._consumers)

    @property
    def consumer_total(self) -> int:
        """Consumers on every node (others' as of the last heartbeat)."""
        return len(self._consumers) + self.remote_consumers

    @property
    def unconfirmed(self) -> int:
        """Messages this node's consumers hold."""
        return sum(len(c.unconfirmed) for c in self._consumers)

    def oldest_accepted_at(self) -> float | None:
        """Not known locally."""
        return None

    def attach(self, consumer: Consumer) -> None:
        """Start delivering to ``consumer``."""
        if consumer not in self._consumers:
            self._consumers.append(consumer)
            self._registry.consumers_changed(self)
        self.deliver()

    def detach(self, consumer: Consumer, redeliver: bool = True) -> int:
        """Stop delivering to ``consumer``; what it held goes back to the queue's head."""
        if consumer not in self._consumers:
            return 0
        self._consumers.remove(consumer)
        self._next = 0
        returned = list(consumer.unconfirmed.values())
        consumer.unconfirmed.clear()
        consumer.unconfirmed_bytes = 0
        self._registry.consumers_changed(self)
        if returned:
            self._give_back(returned)
        self._registry.release(self)
        return len(returned)

    def confirm(self, consumer: Consumer, guid: bytes) -> bool:
        """Take ``guid`` off ``consumer``; the Redis confirm follows in a batch."""
        if consumer.take(guid) is None:
            return False
        self._registry.confirmed(self, guid, consumer)
        return True

    def confirm_run(self, consumer: Consumer, guids: list[bytes]) -> list[bytes]:
        """``confirm`` each of ``guids``, in order; the GUIDs ``consumer`` does not hold."""
        return [guid for guid in guids if not self.confirm(consumer, guid)]

    def reject(self, consumer: Consumer, guid: bytes, requeue: bool, delay: float) -> bool:
        """Give ``guid`` back: to the head with ``requeue`` (after ``delay`` seconds),
        else to the graveyard as ``rejected``."""
        message = consumer.take(guid)
        if message is None:
            return False
        self.rejected += 1
        self._registry.count(self.uri, "rejected")
        if not requeue:
            self.dead[REASON_REJECTED] += 1
            self._registry.graveyard.bury(self.uri, [(message, REASON_REJECTED)])
        elif delay > 0:
            self._registry.spawn(self._registry.delay(self.uri, guid, delay))
        else:
            self._give_back([message])
        return True

    def _give_back(self, messages: list[StoredMessage]) -> None:
        """Released messages (requeue, session lost): those the lifecycle dead-letters
        on release (spent, or past the TTL) are buried, the rest go back to the head."""
        policy = self.policy
        back: list[bytes] = []
        dead: list[tuple[StoredMessage, str]] = []
        now = self._registry.now_ms() / 1000
        for message in messages:
            reason = release(message.delivery_count, message.accepted_at, now, policy)
            if reason is None:
                back.append(message.guid)
            else:
                dead.append((message, reason))
        if dead:
            for _, reason in dead:
                self.dead[reason] += 1
            self._registry.graveyard.bury(self.uri, dead)
        if back:
            self._returning += 1
            self._registry.spawn(self._return(back))

    def deliver(self) -> None:
        """Claim as many messages as local consumers have room for, and PUSH them."""
        if self._claiming or self._returning or not self._consumers:
            return
        if self.uri in self._registry.repairing or self._registry.owed.owes(self.uri):
            return
        if not self._registry.may_deliver():
            return
        room = sum(
            max(0, c.limits.max_messages - len(c.unconfirmed))
            for c in self._consumers
            if c.has_room()
        )
        if room:
            self._claiming = True
            self._registry.spawn(self._claim(min(room, CLAIM_BATCH)))

    @property
    def busy(self) -> bool:
        """A claim or a give-back is on its way (the registry keeps the queue till then)."""
        return self._claiming or self._returning > 0

    async def _claim(self, n: int) -> None:
        # The claim holds the queue until what it could not hand out is back at the
        # head: a claim started while an UNCLAIM is on its way would overtake it.
        try:
            again = await self._claim_and_hand_out(n)
        finally:
            self._claiming = False
            self._registry.release(self)  # if every session here left meanwhile
        if again:
            self.deliver()

    async def _claim_and_hand_out(self, n: int) -> bool:
        """One claim of at most ``n``; True if the queue may hold more to deliver."""
        keys = self.keys
        registry = self._registry
        node = registry.node_id
        policy = self.policy
        now = registry.now_ms()
        cutoff = ttl_cutoff_ms(now, policy.ttl)
        # Compared with what the node saw before sending: another script's reply (a
        # confirm run after this claim) may overtake this one's on its own connection.
        seen = registry.seqs.highest(self.uri)
        # A repeat answers what a lost claim took, whatever ``n``: claim again after it.
        repeat = registry.takes.repeats(self.uri, CLAIMING)
        try:
            await registry.remember_queue(self.uri)
            raw = await registry.takes.run(
                registry.client,
                self.uri,
                CLAIMING,
                lambda token: claim(
                    keys,
                    node=node,
                    lease=registry.lease(keys),
                    most=n,
                    now_ms=now,
                    max_deliveries=policy.max_deliveries or 0,
                    cutoff_ms=cutoff,
                    token=token,
                ),
            )
            seq = int(raw.pop())
            # A claim that wrote moves the sequence past all the node saw; if it does
            # not, Redis went back: what it handed out may be confirmed already.
            went_back = bool(raw) and seq <= seen
            went_back = went_back or self.uri in registry.repairing
            registry.seqs.saw(self.uri, seq)
        except StoreError as error:
            log.warning("%s: claiming failed: %s", self.uri, error)
            # Not again at once: a failure that is quick (FENCED, Redis out of memory)
            # would make a loop of it; the poll claims next.
            raw, went_back, repeat = [], False, False
        messages: list[StoredMessage] = []
        dead: list[tuple[StoredMessage, str]] = []
        claimed = [Claimed(*row) for row in rows(raw, 5)]
        for one in claimed:
            message = parse_message(self.uri, one.guid, one.payload, one.meta, one.deliveries)
            if one.reason:
                dead.append((message, text(one.reason)))
            else:
                messages.append(message)
        if dead:
            for _, reason in dead:
                self.dead[reason] += 1
            registry.graveyard.bury(self.uri, dead)
        if went_back and registry.on_went_back is not None:
            # Nothing handed out before the loss check re-applied the node's confirms
            # (a repair under way wakes the queue when it is done).
            await self._unclaim(messages)
            if self.uri in registry.repairing:
                return False
            await registry.on_went_back()
            return True
        leftover = self._hand_out(messages)
        if leftover:
            # Room may have come back while the UNCLAIM was on its way (a consumer
            # that left and one that attached): look again once it is done.
            await self._unclaim(leftover)
            return True
        return repeat or len(claimed) == n  # there may be more

    def _hand_out(self, messages: list[StoredMessage]) -> list[StoredMessage]:
        consumers = self._consumers
        leftover: list[StoredMessage] = []
        sent: list[tuple[StoredMessage, int]] | None = [] if spans.active() else None
        for message in messages:
            for _ in range(len(consumers)):
                consumer = consumers[self._next % len(consumers)]
                self._next += 1
                if consumer.has_room():
                    consumer.unconfirmed[message.guid] = message
                    consumer.unconfirmed_bytes += len(message.payload)
                    consumer.sink.push(consumer.queue_id, message, message.delivery_count)
                    self._registry.recent.delivered(self.uri, message.guid, message.delivery_count)
                    if sent is not None:
                        sent.append((message, message.delivery_count))
                    self.pushed += 1
                    self.redelivered += message.delivery_count > 1
                    break
            else:
                leftover.append(message)
        if sent:
            spans.delivered(sent, None)  # the claim made the counts durable already
        return leftover

    async def _unclaim(self, messages: list[StoredMessage]) -> None:
        """Claimed messages no local consumer had room for (they left, or filled up,
        while the claim was on its way) go back as if never claimed: PUSHed to nobody,
        they were not delivered, so their delivery counts and pickup deadlines are
        restored (``UNCLAIM``)."""
        registry = self._registry
        keys = self.keys
        node = registry.node_id
        back = [Unclaimed(m.guid, pickup_deadline_ms(m)) for m in messages]
        try:
            await registry.client.run(
                unclaim(keys, node=node, lease=registry.lease(keys), messages=back)
            )
        except StoreError as error:
            # Still this node's deliveries: owed, tried again by the sweep.
            log.error("%s: could not give back %d claimed messages: %s", self.uri, len(back), error)
            registry.owed.add(self.uri, node, unclaims=back)
        registry.wake(self.uri)

    async def _return(self, guids: list[bytes]) -> None:
        try:
            await self._requeue(guids)  # which wakes every node's consumers of the queue
        finally:
            self._returning -= 1
            self._registry.release(self)

    async def _requeue(self, guids: list[bytes]) -> None:
        await self._registry.requeue(self.uri, guids)


class RemoteDepth:
    """The length of a queue's ready list in Redis as this node last read it: what the
    metrics collector takes ``len()`` of (the messages themselves are not here)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __len__(self) -> int:
        return self.count


def parse_message(uri: str, guid: bytes, payload: bytes, meta: bytes, count: int) -> StoredMessage:
    """A message as a script returned it (``<digest>|<accepted_ms>|<properties>``)."""
    digest, accepted, properties = meta.split(b"|", 2)
    return StoredMessage(
        uri,
        guid,
        payload,
        json.loads(properties) if properties != b"{}" else NO_PROPERTIES,
        int(accepted) / 1000,
        int(count),
        int(digest),
    )


def pickup_deadline_ms(message: StoredMessage) -> int:
    """A message's pickup deadline (``x-ttl-ms`` after its acceptance), in ms; 0 if it
    has none (the PUT script's convention)."""
    ttl_ms = message.properties.get(PICKUP_TTL) if message.properties else None
    return 0 if ttl_ms is None else round(message.accepted_at * 1000) + int(ttl_ms)


def message_meta(message: StoredMessage) -> str:
    """The meta a script keeps for ``message`` (see ``parse_message``)."""
    properties = dict(message.properties)
    text = json.dumps(properties, separators=(",", ":")) if properties else "{}"
    return f"{message.digest}|{round(message.accepted_at * 1000)}|{text}"


__all__ = [
    "CLAIM_BATCH",
    "RedisQueue",
    "RemoteDepth",
    "message_meta",
    "parse_message",
    "pickup_deadline_ms",
]

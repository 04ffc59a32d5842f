"""The memory store's ``Queue`` against the lifecycle table as its model (Hypothesis).

A ``RuleBasedStateMachine`` drives random sequences of PUTs, deliveries, confirms,
rejects (with and without requeue, with a delay), session losses, purges and clock
steps into one ``Queue`` with a delivery limit, a TTL and pickup deadlines. After each
step, every message the queue touched is checked against ``lifecycle.apply`` for the
same event at the same time: the state it is in, its delivery count and, when it was
dead-lettered, the reason. RabbitMQ tests its quorum queue (``rabbit_fifo``) this way.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from holdfast.broker.consumers import Consumer, FlowLimits
from holdfast.broker.dedup import GuidHistory
from holdfast.broker.lifecycle import Event, Message, State, apply
from holdfast.broker.queues import Queue
from holdfast.broker.store import NO_PROPERTIES, MemoryStore, StoredMessage
from holdfast.broker.updates import PendingPush, Updates
from holdfast.proto.policy import PICKUP_TTL, QueuePolicy

POLICY = QueuePolicy(max_deliveries=3, ttl=10.0)


class Clock:
    """The queue's clock, moved by the machine only."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pushes:
    """Counts handed over at once (no event loop, no store): what was PUSHed, by GUID."""

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        self.counts[message.guid] = delivery_count

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        raise AssertionError("only a Redis node that lost its lease revokes deliveries")


class SyncUpdates(Updates):
    """``Updates`` without an event loop: PUSHes leave at once."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())

    def removed(self, queue_uri: str, guid: bytes) -> None:
        """Nothing to persist."""

    def removed_run(self, queue_uri: str, guids: list[bytes]) -> None:
        """Nothing to persist."""

    def delivered(self, queue_uri: str, pushes: list[PendingPush]) -> None:
        """Hand every PUSH to its consumer now."""
        for consumer, message, count in pushes:
            consumer.sink.push(consumer.queue_id, message, count)


class Graveyard:
    """Records each burial's reason and lets the message go."""

    def __init__(self) -> None:
        self.reasons: dict[bytes, str] = {}

    def bury(self, queue: Queue, dead: list[tuple[StoredMessage, str]]) -> None:
        for message, reason in dead:
            assert message.guid not in self.reasons, "buried twice"
            self.reasons[message.guid] = reason
            queue.forget(message)


class QueueMachine(RuleBasedStateMachine):
    """One queue, one consumer that holds one message at a time, and the model."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.graveyard = Graveyard()
        self.queue = Queue("hf://t/q", GuidHistory(), SyncUpdates(), self.graveyard, self.clock)
        self.queue.policy = POLICY
        self.pushes = Pushes()
        self.consumer = Consumer(1, self.pushes, FlowLimits(max_messages=1))
        self.model: dict[bytes, Message] = {}
        self.next_guid = 0

    # -- what the queue holds, as lifecycle states --------------------------------------

    def state_of(self, guid: bytes) -> State:
        if guid in self.graveyard.reasons:
            return State.DEAD
        if guid in self.consumer.unconfirmed:
            return State.HELD
        if any(entry[2].guid == guid for entry in self.queue.delayed):
            return State.DELAYED
        if any(m.guid == guid for m in self.queue.ready):
            return State.READY
        return State.CONFIRMED if self.model[guid].state is State.CONFIRMED else State.PURGED

    def held(self) -> list[bytes]:
        return list(self.consumer.unconfirmed)

    def expect(self, guid: bytes, event: Event, then_delivered: bool = False) -> None:
        """Apply ``event`` to the model of ``guid`` and compare with the queue.
        ``then_delivered``: the queue may have delivered it in the same step (a
        released delay is delivered at once when the consumer has room)."""
        after = apply(self.model[guid], event, self.clock.now, POLICY).message
        if then_delivered and after.state is State.READY:
            self.model[guid] = after
            if self.state_of(guid) is not State.READY:
                after = apply(after, Event.DELIVER, self.clock.now, POLICY).message
        self.model[guid] = after
        assert self.state_of(guid) is after.state, (guid, event, after)
        if after.state is State.DEAD:
            assert self.graveyard.reasons[guid] == after.reason
        if after.state is State.HELD:
            assert self.pushes.counts[guid] == after.delivery_count

    def in_state(self, state: State) -> list[bytes]:
        return [g for g, m in self.model.items() if m.state is state]

    # -- the events ------------------------------------------------------------------------

    @rule(pickup=st.sampled_from([None, 3.0, 20.0]))
    def put(self, pickup: float | None) -> None:
        guid = self.next_guid.to_bytes(16, "big")
        self.next_guid += 1
        properties = NO_PROPERTIES if pickup is None else {PICKUP_TTL: str(int(pickup * 1000))}
        message = StoredMessage("hf://t/q", guid, b"x", properties, self.clock.now)
        self.queue.add(message)
        self.model[guid] = Message(
            State.READY,
            accepted_at=self.clock.now,
            pickup_deadline=None if pickup is None else self.clock.now + pickup,
        )

    @rule()
    def deliver(self) -> None:
        """The consumer attaches (or is already attached) and the queue delivers: every
        ready message it looked at took DELIVER."""
        before = {g for g in self.in_state(State.READY)}
        looked = [m.guid for m in self.queue.ready]
        if self.consumer not in self.queue.consumers:
            self.queue.attach(self.consumer)
        else:
            self.queue.deliver()
        for guid in looked:
            if guid in before and self.state_of(guid) is not State.READY:
                self.expect(guid, Event.DELIVER)

    @precondition(lambda self: bool(self.consumer.unconfirmed))
    @rule(how=st.sampled_from(["confirm", "reject", "requeue", "delay"]))
    def settle(self, how: str) -> None:
        [guid] = self.held()
        if how == "confirm":
            assert self.queue.confirm(self.consumer, guid)
            self.expect(guid, Event.CONFIRM)
        elif how == "reject":
            assert self.queue.reject(self.consumer, guid, requeue=False, delay=0.0)
            self.expect(guid, Event.REJECT)
        elif how == "requeue":
            assert self.queue.reject(self.consumer, guid, requeue=True, delay=0.0)
            self.expect(guid, Event.REQUEUE)
        else:
            assert self.queue.reject(self.consumer, guid, requeue=True, delay=5.0)
            self.expect(guid, Event.DELAY)

    @precondition(lambda self: self.consumer in self.queue.consumers)
    @rule()
    def session_lost(self) -> None:
        held = self.held()
        self.queue.detach(self.consumer, redeliver=False)
        for guid in held:
            self.expect(guid, Event.SESSION_LOST)

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0, 11.0]))
    def tick(self, seconds: float) -> None:
        """Time passes and the sweep runs (``QueueRegistry.sweep``'s order)."""
        self.clock.now += seconds
        now = self.clock.now
        due = [e[2].guid for e in self.queue.delayed if e[0] <= now]
        ready = self.in_state(State.READY)
        self.queue.release_due(now)
        for guid in due:
            self.expect(guid, Event.DUE, then_delivered=True)
        self.queue.expire(now)
        self.queue.expire_pickups(now)
        for guid in ready:
            # Releasing due messages delivers what is ready, before the TTL sweep.
            held = self.state_of(guid) is State.HELD
            self.expect(guid, Event.DELIVER if held else Event.TICK)
        for guid in self.in_state(State.HELD) + self.in_state(State.DELAYED):
            self.expect(guid, Event.TICK)

    @rule(seconds=st.sampled_from([1.0, 6.0]))
    def time_passes(self, seconds: float) -> None:
        """Time passes between two sweeps: what a delivery meets then, it decides."""
        self.clock.now += seconds

    @rule()
    def purge(self) -> None:
        touched = self.in_state(State.READY) + self.in_state(State.DELAYED)
        held = self.in_state(State.HELD)
        self.queue.purge()
        for guid in touched + held:
            self.expect(guid, Event.PURGE)

    @invariant()
    def every_message_is_where_the_model_says(self) -> None:
        for guid, message in self.model.items():
            assert self.state_of(guid) is message.state, (guid, message)
        assert set(self.queue.live) == {
            g for g, m in self.model.items() if m.state in (State.READY, State.HELD, State.DELAYED)
        }


QueueMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestQueueAgainstTheTable = QueueMachine.TestCase

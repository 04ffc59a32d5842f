"""Each real store against the lifecycle table, by random sequences (Hypothesis).

A ``RuleBasedStateMachine`` drives a real broker (memory, sqlite, and Redis on a
redis-server the suite starts) through the SDK, on the broker's manual clock: PUTs
(some with a pickup TTL), a consumer that attaches with room for one message, confirms,
rejects (without requeue, with requeue, with a delay), the loss of its session and
clock steps. The model is ``lifecycle.apply`` over every message, plus the order rule
of the table (a put joins the back, a release goes to the front, a ready message is
delivered when the consumer has room). After each step the broker must show, within a
bounded wait, what the model says: every delivery in order with its delivery count,
the ready messages in delivery order, how many are held, and each dead-lettered
message's reason and delivery count. RabbitMQ tests its quorum queue this way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from holdfast.broker.lifecycle import Event, Message, Rules, State, apply
from holdfast.proto.policy import DEATH_REASON, DELIVERY_COUNT, PICKUP_TTL, QueuePolicy
from holdfast.sdk import AckStatus, QueueOptions, Session
from holdfast.sdk import Message as Delivery
from tests.conformance.conftest import store_spec
from tests.conformance.harness import World, open_world
from tests.conformance.support import Inbox, peek, post_and_wait
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(180)]

RULES = Rules(max_deliveries=3, ttl=10.0)
DELAY = 5.0
ONE = QueueOptions(max_unconfirmed_messages=1)


@dataclass
class Model:
    """What the table says the queue holds."""

    now: float
    messages: dict[bytes, Message] = field(default_factory=dict)
    ready: list[bytes] = field(default_factory=list)
    """READY payloads in delivery order."""
    delayed: list[tuple[float, int, bytes]] = field(default_factory=list)
    """(due, order taken, payload) of DELAYED ones."""
    delivered: list[tuple[bytes, int]] = field(default_factory=list)
    """Every PUSH, in order: (payload, delivery count)."""
    held: bytes | None = None
    attached: bool = False

    def take(self, payload: bytes, event: Event) -> State:
        """Apply ``event`` to one message; keep the order lists in step."""
        before = self.messages[payload]
        after = apply(before, event, self.now, RULES).message
        self.messages[payload] = after
        if before.state is State.READY and after.state is not State.READY:
            self.ready.remove(payload)
        if before.state is State.HELD and after.state is not State.HELD:
            self.held = None
        if after.state is State.HELD:
            self.held = payload
            self.delivered.append((payload, after.delivery_count))
        return after.state

    def release(self, payload: bytes, event: Event) -> None:
        """A release: back to the front unless the table dead-letters it."""
        if self.take(payload, event) is State.READY:
            self.ready.insert(0, payload)

    def settle(self) -> None:
        """Deliver the head of the queue while the consumer has room."""
        while self.attached and self.held is None and self.ready:
            self.take(self.ready[0], Event.DELIVER)

    def dead(self) -> dict[bytes, tuple[str | None, int]]:
        return {
            p: (m.reason, m.delivery_count)
            for p, m in self.messages.items()
            if m.state is State.DEAD
        }


class StoreMachine(RuleBasedStateMachine):
    """One queue with a delivery limit of 3 and a TTL of 10 s on one store."""

    world: World

    def __init__(self) -> None:
        super().__init__()
        world = self.world
        self.uri, self.dead_uri = world.uri("machine"), world.uri("machine-dead")
        world.admin.set_policy(
            self.uri,
            QueuePolicy(
                max_deliveries=RULES.max_deliveries, ttl=RULES.ttl, dead_letter=self.dead_uri
            ),
        )
        self.model = Model(now=world.time.monotonic())
        self.producer = world.session().__enter__()
        self.consumer: Session | None = None
        self.inbox = Inbox()
        self.serial = 0

    def teardown(self) -> None:
        if self.consumer is not None:
            self.consumer.close(timeout=1)
        self.producer.close(timeout=1)

    # -- what the broker shows ------------------------------------------------------------

    def observed(self) -> tuple[object, ...]:
        world = self.world
        dead = {
            m.payload: (m.properties[DEATH_REASON], int(m.properties[DELIVERY_COUNT]))
            for m in peek(world, self.dead_uri)
        }
        delivered = [(m.payload, m.delivery_count) for m in self.inbox.messages]
        ready = [m.payload for m in peek(world, self.uri)]
        return delivered, ready, world.admin.stats(self.uri).unconfirmed, dead

    def expected(self) -> tuple[object, ...]:
        model = self.model
        held = int(model.held is not None)
        return list(model.delivered), list(model.ready), held, model.dead()

    def check(self) -> None:
        self.model.settle()
        want = self.expected()
        try:
            wait_until(lambda: self.observed() == want, 10, "the store to match the table")
        except AssertionError:
            assert self.observed() == want  # shows the difference
            raise

    def message(self) -> Delivery:
        held = self.model.held
        [message] = [m for m in self.inbox.messages if m.payload == held][-1:]
        return message

    # -- the events ------------------------------------------------------------------------

    @rule(pickup=st.sampled_from([None, None, 3.0]))
    def put(self, pickup: float | None) -> None:
        self.serial += 1
        payload = b"m%d" % self.serial
        properties = None if pickup is None else {PICKUP_TTL: str(int(pickup * 1000))}
        status = post_and_wait(self.producer, self.uri, payload, properties=properties)
        assert status is AckStatus.SUCCESS
        now = self.model.now
        self.model.messages[payload] = Message(
            State.READY, accepted_at=now, pickup_deadline=None if pickup is None else now + pickup
        )
        self.model.ready.append(payload)
        self.check()

    @precondition(lambda self: not self.model.attached)
    @rule()
    def attach(self) -> None:
        self.consumer = self.world.session().__enter__()
        self.consumer.open_queue(self.uri, read=True, on_message=self.inbox, options=ONE)
        self.model.attached = True
        self.check()

    @precondition(lambda self: self.model.held is not None)
    @rule(how=st.sampled_from(["confirm", "reject", "requeue", "delay"]))
    def settle(self, how: str) -> None:
        message, payload = self.message(), self.model.held
        assert payload is not None
        if how == "confirm":
            message.confirm()
            self.model.take(payload, Event.CONFIRM)
        elif how == "reject":
            message.reject(requeue=False)
            self.model.take(payload, Event.REJECT)
        elif how == "requeue":
            message.reject(requeue=True, delay=0.0)
            self.model.release(payload, Event.REQUEUE)
        else:
            message.reject(requeue=True, delay=DELAY)
            self.model.take(payload, Event.DELAY)
            due = (self.model.now + DELAY, self.serial, payload)
            self.model.delayed.append(due)
        self.check()

    @precondition(lambda self: self.model.attached)
    @rule()
    def session_lost(self) -> None:
        assert self.consumer is not None
        self.consumer.close(timeout=2)
        self.consumer = None
        self.model.attached = False
        if self.model.held is not None:
            self.model.release(self.model.held, Event.SESSION_LOST)
        self.check()

    @rule(seconds=st.sampled_from([1.0, 2.5, 6.0]))
    def tick(self, seconds: float) -> None:
        """Time passes; the broker's sweep (every 0.1 s of real time) sees it."""
        model = self.model
        self.world.time.advance(seconds)
        model.now += seconds
        due = sorted(d for d in model.delayed if d[0] <= model.now)
        # Due messages go back to the front in due order, then the consumer takes one.
        for entry in reversed(due):
            model.delayed.remove(entry)
            model.release(entry[2], Event.DUE)
        model.settle()
        for payload in list(model.ready):
            model.take(payload, Event.TICK)
        model.settle()
        self.check()


def run_on(world: World) -> None:
    StoreMachine.world = world
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker on one store, seen directly (the machine drives the broker's rules)."""
    kind = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-machine")
    with open_world(kind, store_spec(kind, request, directory), "direct", directory) as world:
        yield world


def test_the_store_follows_the_lifecycle_table(store_world: World) -> None:
    run_on(store_world)

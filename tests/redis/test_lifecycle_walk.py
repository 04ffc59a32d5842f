"""Every row of the lifecycle table, walked on the Redis store (its Lua scripts and the
Python around them), with ``lifecycle.apply`` as the model.

One case per row of ``TRANSITIONS``, named after it: a short scenario brings one message
into the row's state with the row's guard true (or every earlier guard of its cell
false), then takes the row's event. After every step the message's place in Redis
(ready list, delayed set, a node's deliveries, the dead-letter queue, or gone), its
delivery count and its dead-letter reason must be what ``apply`` says, and the last
step must have taken the row named. A rule missing from a script fails its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from holdfast.broker.lifecycle import (
    TRANSITIONS,
    Admission,
    Event,
    Guard,
    Message,
    Outcome,
    Row,
    Rules,
    State,
    admit,
    apply,
)
from holdfast.proto import pb
from holdfast.proto.columns import PutRow
from holdfast.proto.policy import REASON_EXPIRED
from tests.redis.lifecycle_world import STAGE_RETENTION, RedisWorld, Seen, in_world

DELAY = 5.0
"""Seconds of every reject delay in the walk."""


@dataclass(frozen=True, slots=True)
class Step:
    """One thing that happens: ``kind`` names a ``RedisWorld`` action (or ``advance``
    and ``policy``), ``value`` is its argument."""

    kind: str
    value: float | tuple[int | None, float | None] | None = None


EVENT_OF = {
    "deliver": Event.DELIVER,
    "confirm": Event.CONFIRM,
    "reject": Event.REJECT,
    "requeue": Event.REQUEUE,
    "delay": Event.DELAY,
    "session-lost": Event.SESSION_LOST,
    "node-lost": Event.NODE_LOST,
    "purge": Event.PURGE,
    "commit": Event.COMMIT,
    "discard": Event.DISCARD,
}
STEP_OF = {event: kind for kind, event in EVENT_OF.items()} | {
    Event.TICK: "sweep",
    Event.DUE: "sweep",
}
PREFIX = {
    State.READY: [Step("put")],
    State.HELD: [Step("put"), Step("deliver")],
    State.DELAYED: [Step("put"), Step("deliver"), Step("delay")],
    State.STAGED: [Step("stage")],
}
"""How a message gets into each state."""

POLICY = {
    Guard.SPENT: Step("policy", (1, None)),
    Guard.EXPIRED: Step("policy", (3, 10.0)),
    Guard.ALWAYS: Step("policy", (3, 10.0)),
}
"""The policy that makes a row's guard true (SPENT: one delivery spends a message)."""

SPECIAL: dict[tuple[State, Event, Guard], list[Step]] = {
    # A READY message is spent only if the limit was lowered while it waited.
    (State.READY, Event.DELIVER, Guard.SPENT): [
        Step("policy", (2, None)),
        Step("put"),
        Step("deliver"),
        Step("requeue"),
        Step("policy", (1, None)),
        Step("deliver"),
    ],
    (State.READY, Event.TICK, Guard.PICKUP_MISSED): [
        Step("policy", (3, None)),
        Step("put", 3.0),
        Step("advance", 4.0),
        Step("sweep"),
    ],
    (State.READY, Event.DELIVER, Guard.PICKUP_MISSED): [
        Step("policy", (3, None)),
        Step("put", 3.0),
        Step("advance", 4.0),
        Step("deliver"),
    ],
    (State.READY, Event.TICK, Guard.ALWAYS): [
        Step("policy", (3, 10.0)),
        Step("put", 3.0),
        Step("advance", 1.0),
        Step("sweep"),
    ],
    # A staged row is past its deadline only after the staging retention.
    (State.STAGED, Event.TICK, Guard.STAGE_EXPIRED): [
        Step("stage"),
        Step("advance", STAGE_RETENTION + 1),
        Step("sweep"),
    ],
    (State.STAGED, Event.TICK, Guard.ALWAYS): [
        Step("stage"),
        Step("advance", STAGE_RETENTION - 1),
        Step("sweep"),
    ],
    # A held message outlives its TTL while held.
    (State.HELD, Event.TICK, Guard.ALWAYS): [
        Step("policy", (3, 10.0)),
        *PREFIX[State.HELD],
        Step("advance", 11.0),
        Step("sweep"),
    ],
}


def scenario(row: Row) -> list[Step]:
    """The steps that end by taking ``row``."""
    special = SPECIAL.get((row.state, row.event, row.guard))
    if special is not None:
        return special
    steps = [POLICY[row.guard], *PREFIX[row.state]]
    if row.guard is Guard.EXPIRED:
        steps.append(Step("advance", 11.0))
    elif row.event is Event.DUE:
        steps.append(Step("advance", DELAY + 1))
    elif row.event is Event.TICK:
        steps.append(Step("advance", 1.0))
    return [*steps, Step(STEP_OF[row.event])]


def row_id(row: Row) -> str:
    return f"{row.state.value}-{row.event.value}-{row.guard.value}"


class Walk:
    """The world and its model, stepped together."""

    def __init__(self, world: RedisWorld) -> None:
        self.world = world
        self.guid = b"\x01" * 16
        self.rules = Rules()
        self.model: Message | None = None
        self.due = 0.0
        self.last: Outcome | None = None

    @property
    def now(self) -> float:
        return self.world.clock.ms / 1000

    async def take(self, step: Step) -> None:
        world = self.world
        kind, value = step.kind, step.value
        if kind == "policy":
            assert isinstance(value, tuple)
            self.rules = Rules(*value)
            await world.set_policy(*value)
            return
        if kind == "advance":
            assert isinstance(value, float)
            world.clock.ms += round(value * 1000)
            return
        if kind == "put":
            assert value is None or isinstance(value, float)
            await world.put(self.guid, value)
            deadline = None if value is None else self.now + value
            self.model = Message(State.READY, accepted_at=self.now, pickup_deadline=deadline)
            await self.check(kind)
            return
        if kind == "stage":
            await world.stage(self.guid)
            deadline = self.now + STAGE_RETENTION
            self.model = Message(State.STAGED, stage_deadline=deadline)
            await self.check(kind)
            return
        assert self.model is not None
        if kind == "sweep":
            due = self.model.state is State.DELAYED and self.due <= self.now
            event = Event.DUE if due else Event.TICK
            await world.sweep()
        else:
            event = EVENT_OF[kind]
            if kind == "deliver":
                await world.deliver()
            elif kind == "confirm":
                await world.confirm()
            elif kind in ("reject", "requeue", "delay"):
                delay = DELAY if kind == "delay" else 0.0
                await world.reject(requeue=kind != "reject", delay=delay)
                self.due = self.now + delay
            elif kind == "session-lost":
                await world.session_lost()
            elif kind == "node-lost":
                await world.node_lost()
            elif kind == "commit":
                await world.commit()
            elif kind == "discard":
                await world.discard()
            else:
                await world.purge()
        self.last = apply(self.model, event, self.now, self.rules)
        self.model = self.last.message
        await self.check(kind)

    async def check(self, kind: str) -> None:
        """The store has the message where the model says, with its count and reason."""
        model = self.model
        assert model is not None
        seen = await self.world.seen(self.guid)
        gone = model.state in (State.CONFIRMED, State.PURGED, State.DISCARDED)
        expected = (None if gone else model.state, model.delivery_count, model.reason)
        if gone:
            assert seen.state is None, f"after {kind}: {seen}, model {model}"
        else:
            assert (seen.state, seen.delivery_count, seen.reason) == expected, (
                f"after {kind}: store {seen}, model {model}"
            )
        if model.state is State.HELD:
            assert self.world.sink.counts[self.guid] == model.delivery_count


@pytest.mark.timeout(30)
@pytest.mark.parametrize("row", TRANSITIONS, ids=row_id)
def test_redis_takes_the_row(row: Row, redis_url: str) -> None:
    async def walk(world: RedisWorld) -> None:
        walker = Walk(world)
        for step in scenario(row):
            await walker.take(step)
        assert walker.last is not None and walker.last.row == row, (
            f"the scenario took {walker.last and walker.last.row}, not {row}"
        )

    in_world(redis_url, walk)


def claim_and_leave(redis_url: str, then: str) -> None:
    """A claim whose consumer left before it returned (a session closed in between):
    node ``a`` claimed the message (counting a delivery) and had nobody to PUSH it to,
    so it went back unseen. In the model it was never delivered."""

    async def walk(world: RedisWorld) -> None:
        guid = b"\x02" * 16
        await world.set_policy(1, None)
        await world.put(guid, 3.0)
        world.queue.attach(world.consumer)  # the claim is on its way
        world.queue.detach(world.consumer)  # ...and its consumer goes
        await world.settle()
        assert await world.seen(guid) == Seen(State.READY, 0)
        if then == "deliver":
            # Not spent: the next consumer gets its first delivery.
            await world.deliver()
            assert await world.seen(guid) == Seen(State.HELD, 1)
            assert world.sink.counts[guid] == 1
        else:
            # Never delivered: its pickup deadline still holds.
            world.clock.ms += 4000
            await world.sweep()
            assert await world.seen(guid) == Seen(State.DEAD, 0, REASON_EXPIRED)

    in_world(redis_url, walk)


@pytest.mark.timeout(30)
def test_a_claim_nobody_took_does_not_count_a_delivery(redis_url: str) -> None:
    claim_and_leave(redis_url, "deliver")


@pytest.mark.timeout(30)
def test_a_claim_nobody_took_keeps_the_pickup_deadline(redis_url: str) -> None:
    claim_and_leave(redis_url, "tick")


@pytest.mark.timeout(30)
def test_a_put_as_old_as_the_window_is_admitted_and_one_ms_older_is_too_old(
    redis_url: str,
) -> None:
    """The PUT script's age rule at its boundary, with ``lifecycle.admit`` as the model:
    TOO_OLD is an age past the window, not one equal to it."""

    async def walk(world: RedisWorld) -> None:
        window = world.puts.cover.window_ms
        ages = [window, window + 1]
        rows = [PutRow(1, bytes([n]) * 16, b"w", {}, age) for n, age in enumerate(ages, 3)]
        model = [admit(None, 0, age, window, False, False) for age in ages]
        assert model == [Admission.ACCEPT, Admission.TOO_OLD]
        assert await world.puts._put(world.uri, rows) == [pb.STATUS_OK, pb.STATUS_TOO_OLD]

    in_world(redis_url, walk)


@pytest.mark.timeout(30)
def test_a_claim_nobody_took_of_a_message_without_a_pickup_ttl_gives_it_none(
    redis_url: str,
) -> None:
    """Given back unseen, a message that had no pickup deadline gets none (a deadline of
    0 would bury it at the next sweep)."""

    async def walk(world: RedisWorld) -> None:
        guid = b"\x03" * 16
        await world.put(guid, None)
        world.queue.attach(world.consumer)
        world.queue.detach(world.consumer)
        await world.settle()
        world.clock.ms += 4000
        await world.sweep()
        assert await world.seen(guid) == Seen(State.READY, 0)

    in_world(redis_url, walk)


@pytest.mark.timeout(30)
def test_a_claim_nobody_took_after_a_delivery_keeps_the_count_and_the_counter(
    redis_url: str,
) -> None:
    """Delivered once and requeued, then claimed for a consumer that left: the claim's
    count (2) and its redelivery are taken back, the first delivery's count stays."""

    async def walk(world: RedisWorld) -> None:
        guid = b"\x04" * 16
        await world.put(guid, 3.0)
        await world.deliver()
        await world.reject(requeue=True)
        world.queue.detach(world.consumer)
        await world.settle()
        assert await world.seen(guid) == Seen(State.READY, 1)
        world.queue.attach(world.consumer)  # the claim is on its way
        world.queue.detach(world.consumer)  # ...and its consumer goes
        await world.settle()
        assert await world.seen(guid) == Seen(State.READY, 1)
        redelivered = await world.client.redis.hget(world.keys.stats, "redelivered")
        assert int(redelivered or 0) == 0
        await world.deliver()
        assert await world.seen(guid) == Seen(State.HELD, 2)

    in_world(redis_url, walk)


TTL_AT = [Step("policy", (3, 10.0)), Step("put"), Step("advance", 10.0)]
TTL_BEFORE = [Step("policy", (3, 10.0)), Step("put"), Step("advance", 9.999)]
PICKUP_AT = [Step("policy", (3, None)), Step("put", 3.0), Step("advance", 3.0)]
PICKUP_BEFORE = [Step("policy", (3, None)), Step("put", 3.0), Step("advance", 2.999)]
BOUNDARIES = {
    "ttl-reached-deliver": [*TTL_AT, Step("deliver")],
    "ttl-not-reached-deliver": [*TTL_BEFORE, Step("deliver")],
    "ttl-reached-sweep": [*TTL_AT, Step("sweep")],
    "ttl-not-reached-sweep": [*TTL_BEFORE, Step("sweep")],
    "pickup-reached-deliver": [*PICKUP_AT, Step("deliver")],
    "pickup-reached-sweep": [*PICKUP_AT, Step("sweep")],
    "pickup-not-reached-sweep": [*PICKUP_BEFORE, Step("sweep")],
    "pickup-not-reached-deliver": [*PICKUP_BEFORE, Step("deliver")],
}
"""A ready message at its TTL or pickup deadline to the millisecond, or one before, then
delivered or swept."""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_at_the_deadline_to_the_millisecond_redis_agrees_with_the_model(
    boundary: str, redis_url: str
) -> None:
    """The guards' comparisons at their edges (``lifecycle``: expired at the deadline,
    not a millisecond before), on delivery (CLAIM) and on the sweep (EXPIRE)."""

    async def walk(world: RedisWorld) -> None:
        walker = Walk(world)
        for step in BOUNDARIES[boundary]:
            await walker.take(step)

    in_world(redis_url, walk)

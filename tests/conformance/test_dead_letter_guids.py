"""Dead letters and their GUIDs, on every store (the Redis store's rule is its ``ADD``
script's Lua, the others' is ``broker.moved_guids``), directly and through the proxy.

Contract rule 9: a dead letter is never in both queues and never in neither. Dedup is
per queue, so two queues may each dead-letter one GUID into one dead-letter queue:
the second takes ``dead_letter_guid(origin, guid, 1)`` and keeps its GUID in
``x-original-guid``, and ``dlq replay`` puts each back under its GUID. A replay leaves
a dead letter whose original queue holds that GUID where it is, and says so. A policy
whose dead-letter queue is the queue itself is refused, templates included; one a
store holds from before counts as no dead-letter queue (it replaced the message by
itself, and on sqlite lost it)."""

from __future__ import annotations

import uuid

import pytest

from holdfast.broker.server import Broker
from holdfast.proto.policy import QueuePolicy, dead_letter_guid
from holdfast.sdk import AckStatus, Message
from holdfast.sdk.errors import HoldfastError
from tests.conformance.harness import World
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def reject(message: Message) -> None:
    message.reject(requeue=False)


def dead_letter(world: World, uri: str, dead: str, count: int) -> None:
    """Consume ``uri`` once, rejecting without requeue; wait for ``dead`` to hold
    ``count`` messages."""
    with world.session() as session:
        inbox = Inbox(reject)
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(1)
        wait_ready(world, dead, count)


def test_one_guid_dead_lettered_from_two_queues_is_two_dead_letters(world: World) -> None:
    first, second, dead, guid = world.uri("a"), world.uri("b"), world.uri("dead"), uuid.uuid4()
    for uri in (first, second):
        world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    with world.session() as session:
        assert post_and_wait(session, first, b"from a", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, second, b"from b", guid=guid) is AckStatus.SUCCESS
    dead_letter(world, first, dead, 1)
    dead_letter(world, second, dead, 2)
    letters = {m.payload: m for m in peek(world, dead)}
    assert letters[b"from a"].guid == guid.bytes
    assert "x-original-guid" not in letters[b"from a"].properties
    renamed = letters[b"from b"]
    assert renamed.guid == dead_letter_guid(second, guid.bytes, 1)
    assert renamed.properties["x-original-guid"] == guid.hex
    assert renamed.properties["x-original-uri"] == second
    # Each is one message to its consumer: confirmed by its GUID, both go.
    with world.session() as session:
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(dead, read=True, on_message=inbox)
        got = inbox.wait(2)
        assert sorted(m.payload for m in got) == [b"from a", b"from b"]
        wait_until(lambda: world.admin.stats(dead).unconfirmed == 0, 15, "both confirmed")
    assert peek(world, dead) == []


def test_a_renamed_dead_letter_is_replayed_under_its_own_guid(direct_world: World) -> None:
    world = direct_world
    first, second, dead, guid = world.uri("a"), world.uri("b"), world.uri("dead"), uuid.uuid4()
    for uri in (first, second):
        world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    with world.session() as session:
        for uri, payload in ((first, b"from a"), (second, b"from b")):
            assert post_and_wait(session, uri, payload, guid=guid) is AckStatus.SUCCESS
    dead_letter(world, first, dead, 1)
    dead_letter(world, second, dead, 2)
    assert world.admin.replay_dead_letters(dead) == (2, "")
    for uri, payload in ((first, b"from a"), (second, b"from b")):
        [back] = wait_ready(world, uri, 1)
        assert (back.guid, back.payload) == (guid.bytes, payload)
        assert "x-original-guid" not in back.properties
    assert peek(world, dead) == []


def test_a_replay_leaves_a_dead_letter_whose_guid_its_queue_holds(direct_world: World) -> None:
    world = direct_world
    origin, dead, guid, other = world.uri("origin"), world.uri("dead"), uuid.uuid4(), uuid.uuid4()
    letter = {"x-original-uri": origin, "x-death-reason": "rejected"}
    with world.session() as session:
        assert post_and_wait(session, origin, b"live", guid=guid) is AckStatus.SUCCESS
        for payload, each in ((b"dead", guid), (b"other", other)):
            status = post_and_wait(session, dead, payload, guid=each, properties=letter)
            assert status is AckStatus.SUCCESS
    count, note = world.admin.replay_dead_letters(dead)
    assert count == 1
    assert f"1 messages left in place: {guid.hex}: {origin} holds a message" in note
    assert [m.payload for m in wait_ready(world, dead, 1)] == [b"dead"]
    assert sorted(m.payload for m in wait_ready(world, origin, 2)) == [b"live", b"other"]
    world.admin.purge(origin)
    assert world.admin.replay_dead_letters(dead) == (1, "")
    assert [m.payload for m in wait_ready(world, origin, 1)] == [b"dead"]
    assert peek(world, dead) == []


def test_a_template_cannot_make_a_queue_its_own_dead_letter_queue(direct_world: World) -> None:
    prefix = direct_world.uri("orders")
    with pytest.raises(HoldfastError, match="cannot be its own dead-letter queue"):
        direct_world.admin.set_policy(prefix + "-*", QueuePolicy(dead_letter=prefix + "-dead"))
    with pytest.raises(HoldfastError, match="cannot be its own dead-letter queue"):
        direct_world.admin.set_policy(prefix + "-dead", QueuePolicy(dead_letter=prefix + "-dead"))
    # Not covered by the template: accepted.
    direct_world.admin.set_policy(prefix + "-*", QueuePolicy(dead_letter=prefix + "dead"))


def dropped(world: World) -> int:
    """Dead messages the broker dropped for want of a dead-letter queue (the metric
    ``holdfast_broker_dead_letters_dropped_total``), all reasons."""

    def read(broker: Broker) -> int:
        queues = broker.queues if broker.redis is None else broker.redis.queues
        return sum(queues.graveyard.dropped.values())

    return int(world.broker.call(read))


def test_a_stored_self_dead_letter_policy_counts_as_none(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template stored before it was refused (the check is bypassed to store it):
    its dead-letter queue's own dead messages are dropped and counted, as without one,
    instead of being moved into themselves."""
    prefix = world.uri("orders")
    orders, dead = prefix + "-eu", prefix + "-dead"
    monkeypatch.setattr(QueuePolicy, "check_for", lambda self, uri: None)
    world.admin.set_policy(prefix + "-*", QueuePolicy(dead_letter=dead))
    monkeypatch.undo()
    with world.session() as session:
        assert post_and_wait(session, orders, b"order") is AckStatus.SUCCESS
    dead_letter(world, orders, dead, 1)
    [letter] = peek(world, dead)
    assert letter.properties["x-original-uri"] == orders
    before = dropped(world)
    with world.session() as session:
        inbox = Inbox(reject)
        session.open_queue(dead, read=True, on_message=inbox)
        assert [m.delivery_count for m in inbox.wait(1)] == [1]
        wait_until(lambda: dropped(world) == before + 1, 15, "dropped, counted")
        assert peek(world, dead) == []
        assert inbox.counts() == [1]


def settle_order(message: Message) -> None:
    """Dead-letter the message ``b"order"``; confirm anything else."""
    if message.payload == b"order":
        message.reject(requeue=False)
    else:
        message.confirm()


def dead_letter_twice(world: World, *, renamed: bool) -> tuple[str, str, uuid.UUID]:
    """``b"order"`` posted to a queue, dead-lettered to a dead-letter queue whose own
    policy dead-letters to a second one, and dead-lettered again there; ``renamed``: each
    dead-letter queue holds the GUID the order would take there first, so each move
    renames it. Returns the queue, the second dead-letter queue and the order's GUID."""
    origin, first, second = world.uri("orders"), world.uri("dead-1"), world.uri("dead-2")
    world.admin.set_policy(origin, QueuePolicy(dead_letter=first))
    world.admin.set_policy(first, QueuePolicy(dead_letter=second))
    guid = uuid.uuid4()
    renamed_once = uuid.UUID(bytes=dead_letter_guid(origin, guid.bytes, 1))
    planted = {first: guid, second: renamed_once} if renamed else {}
    with world.session() as session:
        assert post_and_wait(session, origin, b"order", guid=guid) is AckStatus.SUCCESS
        for uri, each in planted.items():
            assert post_and_wait(session, uri, b"planted", guid=each) is AckStatus.SUCCESS
    dead_letter(world, origin, first, 1 + renamed)
    with world.session() as session:
        inbox = Inbox(settle_order)
        session.open_queue(first, read=True, on_message=inbox)
        inbox.wait(1 + renamed)
        wait_until(lambda: peek(world, first) == [], 15, "the first dead-letter queue emptied")
    wait_ready(world, second, 1 + renamed)
    return origin, second, guid


def test_a_dead_letter_dead_lettered_again_keeps_its_first_origin(world: World) -> None:
    """Moved twice, a dead letter names the queue it first died in (where a replay puts
    it back), and the last move's reason; the second move overwrote the origin."""
    origin, second, guid = dead_letter_twice(world, renamed=False)
    [letter] = peek(world, second)
    assert letter.guid == guid.bytes
    assert letter.properties["x-original-uri"] == origin
    assert letter.properties["x-death-reason"] == "rejected"
    assert world.admin.replay_dead_letters(second) == (1, "")
    [back] = wait_ready(world, origin, 1)
    assert (back.guid, back.payload) == (guid.bytes, b"order")


def test_a_dead_letter_renamed_twice_keeps_its_first_guid(direct_world: World) -> None:
    """Renamed by both moves, it keeps the GUID it had in its first queue in
    ``x-original-guid``, and goes back there under it."""
    world = direct_world
    origin, second, guid = dead_letter_twice(world, renamed=True)
    letter = {m.payload: m for m in peek(world, second)}[b"order"]
    assert letter.properties["x-original-uri"] == origin
    assert letter.properties["x-original-guid"] == guid.hex
    count, note = world.admin.replay_dead_letters(second)
    assert count == 1, note
    [back] = wait_ready(world, origin, 1)
    assert (back.guid, back.payload) == (guid.bytes, b"order")


def test_an_origin_a_producer_names_does_not_make_a_first_death(world: World) -> None:
    """A PUT may carry an ``x-original-uri`` (of a queue its client may write); without
    the ``x-death-reason`` of a move it is no dead letter, so dying it names the queue it
    died in, where a replay puts it back, not the one the producer named."""
    uri, elsewhere, dead = world.uri("orders"), world.uri("elsewhere"), world.uri("dead")
    world.admin.set_policy(uri, QueuePolicy(dead_letter=dead))
    with world.session() as session:
        named = {"x-original-uri": elsewhere}
        assert post_and_wait(session, uri, b"order", properties=named) is AckStatus.SUCCESS
    dead_letter(world, uri, dead, 1)
    [letter] = peek(world, dead)
    assert letter.properties["x-original-uri"] == uri
    assert letter.properties["x-death-reason"] == "rejected"

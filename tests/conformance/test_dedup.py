"""Rule 8 (broker dedup), on every store, directly and through the proxy: a replay is
ACKed SUCCESS and not enqueued again; other content under a known GUID is a CONFLICT;
a GUID is per queue; a GUID is known across sessions."""

from __future__ import annotations

import uuid

import pytest

from holdfast.sdk import AckStatus, Message
from tests.conformance.harness import World
from tests.conformance.support import post_and_wait, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60)]


def test_a_replay_inside_the_window_is_acked_and_enqueued_once(world: World) -> None:
    uri, guid = world.uri(), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"once", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"once", guid=guid) is AckStatus.SUCCESS
    with world.session() as other:  # another session: the GUID is the broker's, not a session's
        assert post_and_wait(other, uri, b"once", guid=guid) is AckStatus.SUCCESS
    [message] = wait_ready(world, uri, 1)
    assert message.guid == guid.bytes and message.payload == b"once"


def test_other_content_under_a_known_guid_is_a_conflict_and_changes_nothing(world: World) -> None:
    uri, guid = world.uri(), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"first", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"second", guid=guid) is AckStatus.CONFLICT
        changed = post_and_wait(session, uri, b"first", guid=guid, properties={"k": "v"})
        assert changed is AckStatus.CONFLICT
    [message] = wait_ready(world, uri, 1)
    assert message.payload == b"first" and dict(message.properties) == {}


def test_one_guid_on_two_queues_is_two_messages(world: World) -> None:
    first, second, guid = world.uri("a"), world.uri("b"), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, first, b"a", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, second, b"b", guid=guid) is AckStatus.SUCCESS
    assert [m.payload for m in wait_ready(world, first, 1)] == [b"a"]
    assert [m.payload for m in wait_ready(world, second, 1)] == [b"b"]


def test_a_guid_stays_known_while_its_message_is_queued_or_held(world: World) -> None:
    """A GUID is known while its message lives, whatever the window: confirm it and only
    the history remembers it; hold it and a replay is still a duplicate."""
    uri, guid = world.uri(), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"held", guid=guid) is AckStatus.SUCCESS
        held: list[Message] = []
        session.open_queue(uri, read=True, on_message=held.append)
        wait_ready(world, uri, 0)
        assert post_and_wait(session, uri, b"held", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"other", guid=guid) is AckStatus.CONFLICT
    wait_ready(world, uri, 1)  # released by the session's close: still one message


def test_after_its_message_is_confirmed_a_guid_is_known_from_the_history(world: World) -> None:
    """The message is gone; inside the window the history still knows the GUID and
    its content: a replay is ACKed and not enqueued again, other content conflicts."""
    uri, guid = world.uri(), uuid.uuid4()
    with world.session() as session:
        assert post_and_wait(session, uri, b"done", guid=guid) is AckStatus.SUCCESS
        taken: list[Message] = []
        reader = session.open_queue(uri, read=True, on_message=taken.append)
        wait_until(lambda: len(taken) == 1, 10, "the delivery")
        taken[0].confirm()
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "the confirm")
        reader.close()
        assert post_and_wait(session, uri, b"done", guid=guid) is AckStatus.SUCCESS
        assert post_and_wait(session, uri, b"other", guid=guid) is AckStatus.CONFLICT
    wait_ready(world, uri, 0)
    assert len(taken) == 1


def test_puts_posted_round_robin_over_queues_are_each_enqueued_once_in_order(world: World) -> None:
    """PUTs posted without waiting, round-robin over three queues, travel in frames that
    mix the queues (the broker accepts such a frame PUT by PUT): each message lands in
    its own queue, in post order, once; the same GUIDs again are replays, even once the
    history alone knows them (the messages confirmed)."""
    uris = [world.uri(name) for name in "abc"]
    guids = [uuid.uuid4() for _ in range(60)]
    acks: list[AckStatus] = []
    with world.session() as session:
        queues = [
            session.open_queue(uri, write=True, on_ack=lambda a: acks.append(a.status))
            for uri in uris
        ]
        for _ in range(2):
            for index, guid in enumerate(guids):
                queues[index % 3].post(b"m%d" % index, guid=guid)
            assert session.flush(30)
    assert acks == [AckStatus.SUCCESS] * 120
    for offset, uri in enumerate(uris):
        mine = [guid.bytes for guid in guids[offset::3]]
        assert [m.guid for m in wait_ready(world, uri, 20)] == mine
    taken: list[Message] = []
    with world.session() as session:
        session.open_queue(uris[0], read=True, on_message=taken.append)
        wait_until(lambda: len(taken) == 20, 10, "the deliveries")
        for message in taken:
            message.confirm()
        wait_until(lambda: world.admin.stats(uris[0]).unconfirmed == 0, 10, "the confirms")
    with world.session() as session:
        queue = session.open_queue(uris[0], write=True, on_ack=lambda a: acks.append(a.status))
        for index in range(0, 60, 3):
            queue.post(b"m%d" % index, guid=guids[index])
        assert session.flush(30)
    assert acks[120:] == [AckStatus.SUCCESS] * 20
    wait_ready(world, uris[0], 0)

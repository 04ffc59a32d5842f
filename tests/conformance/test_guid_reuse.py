"""Two clients post one GUID while the first PUT is still pending (the broker is down,
so both wait in their buffers, or in the proxy's): each is told what the broker would
tell it directly (rule 8 and rule 10), on every store, directly and through the proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from holdfast.sdk import AckStatus, Session
from holdfast.sdk.types import Ack
from tests.conformance.harness import World
from tests.conformance.support import wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


@contextmanager
def broker_down(world: World) -> Iterator[None]:
    """The broker is stopped inside the block and started again (same port) after it."""
    world.broker.stop()
    try:
        yield
    finally:
        world.broker.start()


def post_pending(
    world: World, targets: list[tuple[str, bytes]], guid: uuid.UUID
) -> list[AckStatus]:
    """One session per target opens its queue, then each posts ``guid`` while the
    broker is down; the broker comes back and every PUT gets its outcome."""
    acks: list[list[Ack]] = [[] for _ in targets]
    with ExitStack() as stack:
        sessions: list[Session] = [stack.enter_context(world.session()) for _ in targets]
        queues = [
            s.open_queue(uri, write=True) for s, (uri, _) in zip(sessions, targets, strict=True)
        ]
        with broker_down(world):
            for queue, (_, payload), sink in zip(queues, targets, acks, strict=True):
                queue.post(payload, on_ack=sink.append, guid=guid)
        for session in sessions:
            assert session.flush(timeout=30), "a PUT got no outcome"
    wait_until(lambda: all(len(a) == 1 for a in acks), 5, "one ACK per PUT")
    return [a[0].status for a in acks]


def test_one_guid_to_two_queues_is_two_messages(world: World) -> None:
    first, second, guid = world.uri("a"), world.uri("b"), uuid.uuid4()
    statuses = post_pending(world, [(first, b"to a"), (second, b"to b")], guid)
    assert statuses == [AckStatus.SUCCESS, AckStatus.SUCCESS]
    assert [m.payload for m in wait_ready(world, first, 1)] == [b"to a"]
    assert [m.payload for m in wait_ready(world, second, 1)] == [b"to b"]


def test_one_guid_with_two_contents_on_one_queue_is_one_message_and_a_conflict(
    world: World,
) -> None:
    uri, guid = world.uri(), uuid.uuid4()
    statuses = post_pending(world, [(uri, b"one"), (uri, b"two")], guid)
    assert sorted(s.value for s in statuses) == ["CONFLICT", "SUCCESS"]
    winner = [b"one", b"two"][statuses.index(AckStatus.SUCCESS)]
    assert [m.payload for m in wait_ready(world, uri, 1)] == [winner]


def test_one_guid_with_one_content_from_two_clients_is_one_message(world: World) -> None:
    uri, guid = world.uri(), uuid.uuid4()
    statuses = post_pending(world, [(uri, b"same"), (uri, b"same")], guid)
    assert statuses == [AckStatus.SUCCESS, AckStatus.SUCCESS]
    assert [m.payload for m in wait_ready(world, uri, 1)] == [b"same"]

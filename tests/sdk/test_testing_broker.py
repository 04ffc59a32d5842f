"""``holdfast.sdk.testing.Broker``: the real broker in-process, and its fault hooks."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from holdfast.proto import pb
from holdfast.sdk import Ack, AckStatus, Message, Session
from holdfast.sdk.events import ConnectionLost, Reconnected, SessionEvent, StateRestored
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from tests.support.waiting import wait_until

URI = "hf://test/orders"
FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


def test_posts_are_acked_once_and_delivered_once() -> None:
    acks: list[Ack] = []
    got: list[Message] = []
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, on_ack=acks.append)
        guids = [queue.post(b"m%d" % i) for i in range(100)]
        assert s.flush(timeout=10)

        def consume(message: Message) -> None:
            got.append(message)
            message.confirm()

        s.open_queue(URI, read=True, on_message=consume)
        wait_until(lambda: len(got) == 100, 10, "100 deliveries")
        assert broker.depth(URI) == 0
    assert Counter(a.guid for a in acks) == Counter({g: 1 for g in guids})
    assert {a.status for a in acks} == {AckStatus.SUCCESS}
    assert [m.payload for m in got] == [b"m%d" % i for i in range(100)]


def test_fail_next_puts_refuses_exactly_those_and_they_are_not_in_the_queue() -> None:
    acks: dict[uuid.UUID, AckStatus] = {}
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, on_ack=lambda a: acks.__setitem__(a.guid, a.status))
        broker.fail_next_puts(2, AckStatus.STORE_ERROR)
        refused = [queue.post(b"refused-%d" % i) for i in range(2)]
        assert s.flush(timeout=10)
        kept = queue.post(b"kept")
        assert s.flush(timeout=10)
        assert broker.depth(URI) == 1
    assert [acks[g] for g in refused] == [AckStatus.STORE_ERROR] * 2
    assert acks[kept] is AckStatus.SUCCESS


def test_drop_connections_is_a_reconnect_that_loses_and_duplicates_nothing() -> None:
    events: list[SessionEvent] = []
    acks: list[Ack] = []
    with Broker() as broker:
        with Session(
            broker.address, transport=broker.transport(), on_event=events.append, options=FAST
        ) as s:
            queue = s.open_queue(URI, write=True, on_ack=acks.append)
            guids = [queue.post(b"before-%d" % i) for i in range(50)]
            assert broker.drop_connections() == 1
            guids += [queue.post(b"after-%d" % i) for i in range(50)]
            assert s.flush(timeout=10)
        assert broker.depth(URI) == 100  # replays were recognised by GUID
    assert Counter(a.guid for a in acks) == Counter({g: 1 for g in guids})
    kinds = [type(e) for e in events]
    assert kinds.index(ConnectionLost) < kinds.index(Reconnected) < kinds.index(StateRestored)


def test_history_full_is_retried_by_the_sdk_until_the_broker_takes_the_put() -> None:
    acks: list[Ack] = []
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, on_ack=acks.append)
        broker.fail_next_puts(1, pb.STATUS_HISTORY_FULL)  # a wire status
        guid = queue.post(b"pushed back once")
        assert s.flush(timeout=10)
        assert broker.depth(URI) == 1
    assert [(a.guid, a.status) for a in acks] == [(guid, AckStatus.SUCCESS)]


def test_delay_holds_answers_to_the_client() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True)
        broker.delay(0.3)
        queue.post(b"slow")
        assert not s.flush(timeout=0.1)  # the ACK is held
        assert s.flush(timeout=5)
        broker.delay(0)


def test_hook_arguments_are_checked() -> None:
    broker = Broker()
    with pytest.raises(ValueError, match=">= 0"):
        broker.delay(-1)
    with pytest.raises(ValueError, match=">= 0"):
        broker.fail_next_puts(-1, AckStatus.UNKNOWN)

"""Rules 1-3 of ``docs/contract.md`` (GUIDs, buffer until ACK, ACKs) scripted against
``SessionEngine``; rule 4 is in ``test_engine_reconnect``, rules 5 and 6 in
``test_engine_queues``, rule 7 and bad input in ``test_engine_limits``; the state
tables, age, push-back and bad frames in ``test_engine_guards`` and ``test_bad_frames``.

No sockets, no threads, no clock: each test plays the broker through
``tests/sdk/fakes.Harness``, reads the real ``pb.ClientFrame``s the engine sends
and feeds ``pb.ServerFrame``s back, moving time by hand.
"""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch
from holdfast.sdk.engine import LinkState
from holdfast.sdk.errors import (
    InvalidArgumentError,
)
from holdfast.sdk.types import Ack, AckStatus

from .fakes import URI, Harness, kinds, put_guids, puts_in, reconnect, writer

OTHER = "hf://test/invoices"
THIRD = "hf://test/refunds"


@pytest.fixture
def h() -> Harness:
    return Harness()


# =========================================================================== rule 1: client GUIDs


def test_post_returns_a_uuid_version_7(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    assert isinstance(guid, uuid.UUID)
    assert guid.version == 7


def test_every_put_gets_its_own_time_ordered_guid(h: Harness) -> None:
    queue_id = writer(h)
    guids = [h.post(queue_id) for _ in range(500)]
    assert len(set(guids)) == 500
    assert sorted(guids) == guids


def test_put_frame_carries_exactly_the_returned_guid_bytes(h: Harness) -> None:
    queue_id = writer(h)
    first, second = h.post(queue_id, b"one"), h.post(queue_id, b"two")
    puts = puts_in(h.sent_frames())
    assert [(p.guid, p.payload, p.queue_id) for p in puts] == [
        (first.bytes, b"one", queue_id),
        (second.bytes, b"two", queue_id),
    ]


def test_post_under_a_caller_supplied_guid_sends_that_guid(h: Harness) -> None:
    queue_id = writer(h)
    chosen = uuid.UUID("0190f5a0-0000-7000-8000-000000000001")
    assert h.post(queue_id, guid=chosen) == chosen
    assert put_guids(h.sent_frames()) == [chosen]
    assert h.engine.is_pending(chosen)


def test_caller_supplied_guid_already_pending_is_refused(h: Harness) -> None:
    queue_id = writer(h)
    chosen = uuid.uuid4()
    h.post(queue_id, guid=chosen)
    with pytest.raises(InvalidArgumentError):
        h.post(queue_id, guid=chosen)
    assert h.engine.pending_count == 1
    h.ack(chosen)
    assert h.statuses(chosen) == [AckStatus.SUCCESS]
    h.post(queue_id, guid=chosen)  # ACKed: the GUID may be posted again (the broker dedups)
    assert h.engine.pending_count == 1


def test_guid_is_assigned_while_disconnected(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    guid = h.post(queue_id, b"offline")
    assert guid.version == 7
    assert h.sent_frames() == []
    assert put_guids(reconnect(h)) == [guid]


# ======================================================================= rule 2: buffer until ACK


def test_puts_are_buffered_while_disconnected_handshaking_and_restoring(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    while_down = h.post(queue_id)
    assert h.state() is LinkState.DISCONNECTED
    h.connect()
    while_handshaking = h.post(queue_id)
    assert kinds(h.sent_frames()) == ["hello"]
    h.answer_hello()
    assert h.state() is LinkState.RESTORING
    while_restoring = h.post(queue_id)
    reopen_frames = h.sent_frames()
    assert kinds(reopen_frames) == ["open_queue"]
    assert h.engine.pending_count == 3

    h.answer_opens(reopen_frames)

    assert h.state() is LinkState.ACTIVE
    assert put_guids(h.sent_frames()) == [while_down, while_handshaking, while_restoring]
    assert h.acks == []


def test_nothing_is_sent_while_disconnected(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    for _ in range(3):
        h.post(queue_id)
    assert not h.engine.has_outbound
    assert h.sent_frames() == []


def test_put_is_sent_at_once_while_active(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    assert put_guids(h.sent_frames()) == [guid]


def test_pending_count_drops_only_when_a_put_is_acked(h: Harness) -> None:
    queue_id = writer(h)
    first, second = h.post(queue_id), h.post(queue_id)
    assert put_guids(h.sent_frames()) == [first, second]
    h.engine.transport_drained(10_000)
    assert h.engine.pending_count == 2  # sent and written is not ACKed

    h.ack(first)
    assert h.engine.pending_count == 1
    h.ack(second)
    assert h.engine.pending_count == 0


def test_sent_but_unacked_puts_survive_a_drop(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    assert put_guids(h.sent_frames()) == [guid]
    h.lose()
    assert h.engine.pending_count == 1
    assert put_guids(reconnect(h)) == [guid]


# ==================================================================================== rule 3: ACK


def test_ack_reports_guid_status_and_uri_to_the_puts_on_ack_once(h: Harness) -> None:
    queue_id = writer(h)
    mine: list[Ack] = []
    guid = h.post(queue_id, on_ack=mine.append)
    h.ack(guid)
    assert mine == [Ack(guid, AckStatus.SUCCESS, URI)]
    assert h.acks == []  # the queue-level on_ack is not called as well


def test_queue_level_on_ack_is_used_for_puts_posted_without_one(h: Harness) -> None:
    h.establish()
    queue_acks: list[Ack] = []
    queue_id, _ = h.open_queue(on_ack=queue_acks.append)
    h.answer_opens(h.sent_frames())
    guid = h.post(queue_id)
    h.ack(guid)
    assert queue_acks == [Ack(guid, AckStatus.SUCCESS, URI)]


class _FalsyCallback:
    """A callable that is falsy when empty, like a list-backed recorder."""

    def __init__(self) -> None:
        self.acks: list[Ack] = []

    def __len__(self) -> int:
        return len(self.acks)

    def __call__(self, ack: Ack) -> None:
        self.acks.append(ack)


def test_a_falsy_on_ack_callable_is_still_called(h: Harness) -> None:
    queue_id = writer(h)
    callback = _FalsyCallback()
    guid = h.post(queue_id, on_ack=callback)
    h.ack(guid)
    h.lose()
    expiring = h.post(queue_id, on_ack=_FalsyCallback())
    assert callback.acks == [Ack(guid, AckStatus.SUCCESS, URI)]
    other = _FalsyCallback()
    unknown = h.post(queue_id, on_ack=other)
    h.engine.close_queue(queue_id)
    h.run_callbacks()
    assert [a.guid for a in other.acks] == [unknown]
    assert expiring != unknown


def test_duplicate_ack_is_ignored_and_counted_stale(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.ack(guid)
    h.ack(guid)
    h.ack(guid, status=pb.STATUS_STORE_ERROR)
    assert h.statuses(guid) == [AckStatus.SUCCESS]
    assert h.engine.stale_acks == 2


def test_ack_for_a_guid_never_posted_is_ignored(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.ack(uuid.uuid4())
    assert h.acks == []
    assert h.engine.pending_count == 1
    assert h.engine.stale_acks == 1
    h.ack(guid)
    assert h.statuses(guid) == [AckStatus.SUCCESS]


def test_each_put_of_an_ack_batch_is_reported_with_its_own_status(h: Harness) -> None:
    queue_id = writer(h)
    good, bad = h.post(queue_id), h.post(queue_id)
    batch = ack_batch(
        [(queue_id, good.bytes, pb.STATUS_OK), (queue_id, bad.bytes, pb.STATUS_STORE_ERROR)]
    )
    h.feed(pb.ServerFrame(acks=batch))
    assert h.acks == [
        Ack(good, AckStatus.SUCCESS, URI),
        Ack(bad, AckStatus.STORE_ERROR, URI),
    ]


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (pb.STATUS_OK, AckStatus.SUCCESS),
        (pb.STATUS_UNKNOWN, AckStatus.UNKNOWN),
        (pb.STATUS_NOT_WRITABLE, AckStatus.NOT_WRITABLE),
        (pb.STATUS_INVALID_GUID, AckStatus.INVALID_GUID),
        (pb.STATUS_PAYLOAD_TOO_LARGE, AckStatus.PAYLOAD_TOO_LARGE),
        (pb.STATUS_INVALID_PROPERTIES, AckStatus.INVALID_PROPERTIES),
        (pb.STATUS_UNKNOWN_QUEUE, AckStatus.UNKNOWN_QUEUE),
        (pb.STATUS_STORE_ERROR, AckStatus.STORE_ERROR),
        (pb.STATUS_SHUTTING_DOWN, AckStatus.REFUSED),
        # UNSPECIFIED is no ACK status: test_engine_guards.test_an_ack_status_no_ack_carries...
    ],
)
def test_broker_ack_status_maps_to_ack_status(wire: pb.Status, expected: AckStatus) -> None:
    h = Harness()
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.ack(guid, status=wire)
    assert h.acks == [Ack(guid, expected, URI)]
    assert h.engine.pending_count == 0

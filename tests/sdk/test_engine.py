"""The client-HA rules (``docs/contract.md``, rules 1-7) scripted against ``SessionEngine``.

No sockets, no threads, no clock: each test plays the broker through
``tests/sdk/fakes.Harness``, reads the real ``pb.ClientFrame``s the engine sends
and feeds ``pb.ServerFrame``s back, moving time by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.sdk.engine import HIGH_WATERMARK_WAIT, PUT_OVERHEAD, LinkState
from holdfast.sdk.errors import (
    BufferFullError,
    ConfirmDroppedError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    NotWritableError,
    PayloadTooLargeError,
    ProtocolVersionError,
    QueueNotOpenError,
    RequestFailedError,
    SessionClosedError,
)
from holdfast.sdk.events import (
    ConfirmRejected,
    Connected,
    ConnectionLost,
    QueueReopened,
    Reconnected,
    SessionClosed,
    SessionFailed,
    StateRestored,
)
from holdfast.sdk.frames import encode
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, AckStatus, Message

from .fakes import URI, Harness, kinds, opens_in, put_guids, puts_in

OTHER = "hf://test/invoices"
THIRD = "hf://test/refunds"


@pytest.fixture
def h() -> Harness:
    return Harness()


def writer(h: Harness, uri: str = URI) -> int:
    """Bring the link up and open ``uri`` for writing; return its queue id."""
    h.establish()
    return h.open_active(uri)


def reconnect(h: Harness, *, window: float = 300.0) -> list[pb.ClientFrame]:
    """Connect again, answer Hello and every reopen OK; return everything sent."""
    return h.establish(window=window)


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
    batch = pb.AckBatch()
    batch.acks.add(queue_id=queue_id, guid=good.bytes, status=pb.STATUS_OK)
    batch.acks.add(queue_id=queue_id, guid=bad.bytes, status=pb.STATUS_STORE_ERROR)
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
        (pb.STATUS_UNSPECIFIED, AckStatus.REFUSED),
    ],
)
def test_broker_ack_status_maps_to_ack_status(wire: pb.Status, expected: AckStatus) -> None:
    h = Harness()
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.ack(guid, status=wire)
    assert h.acks == [Ack(guid, expected, URI)]
    assert h.engine.pending_count == 0


# ============================================================================== rule 4: reconnect


def test_reconnect_sends_hello_first_then_reopens_in_open_order_then_puts(h: Harness) -> None:
    h.establish()
    first = h.open_active(URI)
    second = h.open_active(OTHER)
    third = h.open_active(THIRD)
    guid = h.post(second)
    h.lose()

    h.connect()
    assert kinds(h.sent_frames()) == ["hello"]
    h.answer_hello()
    frames = h.sent_frames()
    assert [(o.queue_id, o.uri) for o in opens_in(frames)] == [
        (first, URI),
        (second, OTHER),
        (third, THIRD),
    ]
    assert kinds(frames) == ["open_queue"] * 3
    h.answer_opens(frames)
    assert put_guids(h.sent_frames()) == [guid]


def test_reopen_keeps_read_and_write_flags(h: Harness) -> None:
    h.establish()
    h.open_active(URI, read=True, write=False)
    h.open_active(OTHER, read=True, write=True)
    h.lose()
    h.connect()
    h.answer_hello()
    assert [(o.read, o.write) for o in opens_in(h.sent_frames())] == [
        (True, False),
        (True, True),
    ]


def test_no_put_is_sent_until_every_reopen_is_answered(h: Harness) -> None:
    h.establish()
    first = h.open_active(URI)
    second = h.open_active(OTHER)
    guids = [h.post(first), h.post(second)]
    h.lose()
    h.connect()
    h.answer_hello()
    reopen_first, reopen_second = opens_in(h.sent_frames())

    h.answer(reopen_first.request_id)
    assert puts_in(h.sent_frames()) == []
    assert h.state() is LinkState.RESTORING

    h.answer(reopen_second.request_id)
    assert put_guids(h.sent_frames()) == guids


def test_reopen_carries_options_configured_while_disconnected(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    request_id = h.engine.configure_queue(queue_id, QueueOptions(max_unconfirmed_messages=7))
    h.connect()
    h.answer_hello()
    (reopen,) = opens_in(h.sent_frames())
    assert reopen.options.max_unconfirmed_messages == 7
    assert h.outcomes(request_id) == []
    h.answer(reopen.request_id)
    assert h.outcomes(request_id) == [None]


def test_reopen_carries_only_the_latest_of_several_configures(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    h.engine.configure_queue(queue_id, QueueOptions(max_unconfirmed_messages=7))
    h.engine.configure_queue(queue_id, QueueOptions(max_unconfirmed_messages=9))
    (reopen,) = opens_in(reconnect(h))
    assert reopen.options.max_unconfirmed_messages == 9


def test_configure_pending_at_the_drop_is_completed_by_the_reopen(h: Harness) -> None:
    queue_id = writer(h)
    request_id = h.engine.configure_queue(queue_id, QueueOptions(max_unconfirmed_bytes=1234))
    assert kinds(h.sent_frames()) == ["configure_queue"]
    h.lose()
    h.run_callbacks()
    assert h.outcomes(request_id) == []  # not failed by the drop

    h.connect()
    h.answer_hello()
    (reopen,) = opens_in(h.sent_frames())
    assert reopen.options.max_unconfirmed_bytes == 1234
    h.answer(reopen.request_id)
    assert h.outcomes(request_id) == [None]


def test_open_pending_at_the_drop_is_resent_and_completes_ok(h: Harness) -> None:
    h.establish()
    queue_id, request_id = h.open_queue(URI)
    assert [o.queue_id for o in opens_in(h.sent_frames())] == [queue_id]
    h.lose()
    assert h.outcomes(request_id) == []

    h.connect()
    h.answer_hello()
    (resent,) = opens_in(h.sent_frames())
    assert (resent.queue_id, resent.uri, resent.write) == (queue_id, URI, True)
    h.answer(resent.request_id)
    assert h.outcomes(request_id) == [None]
    h.post(queue_id)  # the queue is open now


def test_open_issued_while_disconnected_is_sent_when_the_link_comes_up(h: Harness) -> None:
    queue_id, request_id = h.open_queue(URI)
    assert h.sent_frames() == []
    h.connect()
    h.answer_hello()
    (sent,) = opens_in(h.sent_frames())
    assert sent.queue_id == queue_id
    h.answer(sent.request_id)
    assert h.outcomes(request_id) == [None]
    assert h.state() is LinkState.ACTIVE


def test_retransmits_unacked_puts_in_post_order(h: Harness) -> None:
    h.establish()
    first = h.open_active(URI)
    second = h.open_active(OTHER)
    a = h.post(first)
    b = h.post(second)
    c = h.post(first)
    h.ack(b)
    h.lose()
    d = h.post(second)  # disconnected
    h.connect()
    e = h.post(first)  # handshaking
    h.answer_hello()
    f = h.post(second)  # restoring
    h.answer_opens(h.sent_frames())
    assert put_guids(h.sent_frames()) == [a, c, d, e, f]


def test_reconnect_events_arrive_in_contract_order(h: Harness) -> None:
    h.establish()
    first = h.open_active(URI)
    h.open_active(OTHER)
    guid = h.post(first)
    h.timeline.clear()

    h.lose("stream reset")
    h.connect("broker-b:7700")
    h.answer_hello(broker_id="broker-2")
    h.answer_opens(h.sent_frames())

    assert h.timeline == [
        ConnectionLost("broker-a:7700", "stream reset"),
        Reconnected("broker-b:7700", "broker-2"),
        QueueReopened(URI),
        QueueReopened(OTHER),
        StateRestored(retransmitted=1, expired=0),
    ]
    assert put_guids(h.sent_frames()) == [guid]


def test_first_connection_reports_connected_not_restored(h: Harness) -> None:
    h.establish()
    assert h.events == [Connected("broker-a:7700", "broker-1")]


def test_state_restored_follows_every_reconnect_even_with_no_queues(h: Harness) -> None:
    h.establish()
    h.lose()
    reconnect(h)
    assert h.events[1:] == [
        ConnectionLost("broker-a:7700", "connection reset"),
        Reconnected("broker-a:7700", "broker-1"),
        StateRestored(retransmitted=0, expired=0),
    ]


def test_state_restored_follows_reconnect_after_a_drop_during_the_first_restore(
    h: Harness,
) -> None:
    """The first connection drops before its first open is answered (still RESTORING)."""
    _, request_id = h.open_queue(URI)
    h.connect()
    h.answer_hello()
    h.sent_frames()
    h.lose()
    h.timeline.clear()

    reconnect(h)

    assert h.outcomes(request_id) == [None]
    assert h.timeline == [
        Reconnected("broker-a:7700", "broker-1"),
        StateRestored(retransmitted=0, expired=0),
    ]


def test_connection_lost_during_the_handshake_is_not_reported(h: Harness) -> None:
    h.establish()
    h.lose()
    h.connect()
    h.lose("handshake timed out")  # a failed attempt: never up, so nothing was lost
    reconnect(h)
    assert [type(e) for e in h.events] == [
        Connected,
        ConnectionLost,
        Reconnected,
        StateRestored,
    ]


def test_puts_older_than_the_dedup_window_less_10_percent_are_reported_unknown(
    h: Harness,
) -> None:
    """A 10 s window leaves a 1 s margin: PUTs older than 9 s are not retransmitted."""
    queue_id = writer(h)
    old = h.post(queue_id)
    h.advance(0.2)
    young = h.post(queue_id)
    h.lose()
    h.advance(8.9)  # old is 9.1 s old, young 8.9 s
    frames = reconnect(h, window=10.0)

    assert put_guids(frames) == [young]
    assert h.statuses(old) == [AckStatus.UNKNOWN]
    assert h.statuses(young) == []
    assert h.events[-1] == StateRestored(retransmitted=1, expired=1)
    assert h.engine.pending_count == 1


def test_dedup_window_margin_is_at_most_two_seconds(h: Harness) -> None:
    """A 300 s window leaves a 2 s margin (not 30 s): PUTs older than 298 s expire."""
    queue_id = writer(h)
    old = h.post(queue_id)
    h.advance(1.0)
    young = h.post(queue_id)
    h.lose()
    h.advance(297.5)  # old is 298.5 s old, young 297.5 s
    frames = reconnect(h, window=300.0)

    assert put_guids(frames) == [young]
    assert h.statuses(old) == [AckStatus.UNKNOWN]
    assert h.events[-1] == StateRestored(retransmitted=1, expired=1)


def test_expiry_uses_the_window_announced_by_the_new_connection(h: Harness) -> None:
    h.establish(window=300.0)
    queue_id = h.open_active()
    guid = h.post(queue_id)
    h.lose()
    h.advance(30.0)
    frames = reconnect(h, window=10.0)  # the new broker remembers GUIDs for 10 s only
    assert put_guids(frames) == []
    assert h.statuses(guid) == [AckStatus.UNKNOWN]


def test_expired_puts_are_reported_before_state_restored(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.lose()
    h.advance(600.0)
    h.timeline.clear()
    reconnect(h, window=300.0)
    assert h.timeline == [
        Reconnected("broker-a:7700", "broker-1"),
        QueueReopened(URI),
        Ack(guid, AckStatus.UNKNOWN, URI),
        StateRestored(retransmitted=0, expired=1),
    ]


def test_late_frames_of_an_old_connection_are_ignored(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    old = h.generation
    h.lose()
    h.ack(guid)  # while disconnected: generation is still the old one
    assert h.acks == []
    assert h.engine.pending_count == 1

    reconnect(h)
    batch = pb.AckBatch()
    batch.acks.add(queue_id=queue_id, guid=guid.bytes, status=pb.STATUS_STORE_ERROR)
    h.feed(pb.ServerFrame(acks=batch), generation=old)
    assert h.acks == []
    assert h.engine.pending_count == 1

    h.ack(guid)
    assert h.statuses(guid) == [AckStatus.SUCCESS]


def test_connection_lost_for_an_old_connection_is_ignored(h: Harness) -> None:
    queue_id = writer(h)
    old = h.generation
    h.lose()
    reconnect(h)
    h.engine.connection_lost(old, "late notice of the first drop")
    h.run_callbacks()
    assert h.state() is LinkState.ACTIVE
    guid = h.post(queue_id)
    assert put_guids(h.sent_frames()) == [guid]


def test_failed_reopen_is_reported_and_its_puts_are_unknown(h: Harness) -> None:
    h.establish()
    lost = h.open_active(URI)
    kept = h.open_active(OTHER)
    doomed = h.post(lost)
    survivor = h.post(kept)
    h.lose()
    h.connect()
    h.answer_hello()
    reopen_lost, reopen_kept = opens_in(h.sent_frames())
    h.timeline.clear()

    h.answer(reopen_lost.request_id, pb.STATUS_UNKNOWN_QUEUE, "no such queue")
    h.answer(reopen_kept.request_id)

    assert h.timeline == [
        QueueReopened(URI, "UNKNOWN_QUEUE: no such queue"),
        Ack(doomed, AckStatus.UNKNOWN, URI),
        QueueReopened(OTHER),
        StateRestored(retransmitted=1, expired=0),
    ]
    assert put_guids(h.sent_frames()) == [survivor]
    with pytest.raises(QueueNotOpenError):
        h.post(lost)


def test_failed_reopen_answered_last_still_restores_the_state(h: Harness) -> None:
    h.establish()
    kept = h.open_active(URI)
    lost = h.open_active(OTHER)
    survivor = h.post(kept)
    h.post(lost)
    h.lose()
    h.connect()
    h.answer_hello()
    reopen_kept, reopen_lost = opens_in(h.sent_frames())

    h.answer(reopen_kept.request_id)
    h.answer(reopen_lost.request_id, pb.STATUS_UNKNOWN_QUEUE)

    assert h.state() is LinkState.ACTIVE
    assert h.events[-1] == StateRestored(retransmitted=1, expired=0)
    assert put_guids(h.sent_frames()) == [survivor]


def test_configure_waiting_on_a_failed_reopen_gets_the_error(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    request_id = h.engine.configure_queue(queue_id, QueueOptions(max_unconfirmed_messages=2))
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames(), status=pb.STATUS_INVALID_ARGUMENT)
    (error,) = h.outcomes(request_id)
    assert isinstance(error, RequestFailedError)
    assert error.status == "INVALID_ARGUMENT"


def test_retransmitted_put_is_reported_once_however_many_acks_arrive(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    old = h.generation
    h.lose()
    reconnect(h)
    h.feed(pb.ServerFrame(acks=pb.AckBatch(acks=[pb.Ack(guid=guid.bytes)])), generation=old)
    h.ack(guid)  # the broker recognised the replay: a success
    h.ack(guid)
    assert h.statuses(guid) == [AckStatus.SUCCESS]


# ================================================================================ rule 5: CONFIRM


def reader(h: Harness) -> int:
    h.establish()
    return h.open_active(URI, read=True, write=False)


def test_confirm_while_connected_sends_a_confirm_batch(h: Harness) -> None:
    queue_id = reader(h)
    guid = h.push(queue_id)
    (message,) = h.messages
    message.confirm()
    (frame,) = h.sent_frames()
    assert frame.WhichOneof("frame") == "confirms"
    assert [(c.queue_id, c.guid) for c in frame.confirms.confirms] == [(queue_id, guid.bytes)]


def test_confirm_while_disconnected_raises_confirm_dropped(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.lose()
    with pytest.raises(ConfirmDroppedError):
        h.messages[0].confirm()
    assert h.sent_frames() == []


def test_confirm_while_handshaking_raises_confirm_dropped(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.lose()
    h.connect()
    with pytest.raises(ConfirmDroppedError):
        h.messages[0].confirm()


def test_confirm_of_a_message_from_an_earlier_connection_is_dropped(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.lose()
    reconnect(h)
    assert h.state() is LinkState.ACTIVE
    with pytest.raises(ConfirmDroppedError):
        h.messages[0].confirm()
    assert [f for f in h.sent_frames() if f.WhichOneof("frame") == "confirms"] == []


def test_confirm_the_broker_does_not_recognise_is_reported_as_an_event(h: Harness) -> None:
    queue_id = reader(h)
    guid = h.push(queue_id)
    h.messages[0].confirm()
    h.sent_frames()
    h.feed(
        pb.ServerFrame(
            error=pb.Error(status=pb.STATUS_UNKNOWN_GUID, queue_id=queue_id, guids=[guid.bytes])
        )
    )
    assert h.events[-1] == ConfirmRejected(URI, (guid,), "UNKNOWN_GUID")
    assert h.state() is LinkState.ACTIVE


def test_unsent_confirm_is_not_carried_over_a_drop(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.messages[0].confirm()  # queued, not yet taken by the transport
    h.lose()
    frames = reconnect(h)
    assert "confirms" not in kinds(frames)


# ================================================================================== rule 6: CLOSE


def test_close_while_disconnected_succeeds_locally(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    assert h.engine.close_queue(queue_id) is None
    assert h.sent_frames() == []


def test_close_while_disconnected_reports_pending_puts_unknown_once(h: Harness) -> None:
    h.establish()
    closed = h.open_active(URI)
    other = h.open_active(OTHER)
    before = h.post(closed)
    h.lose()
    during = h.post(closed)
    untouched = h.post(other)

    h.engine.close_queue(closed)
    h.run_callbacks()

    assert h.acks == [Ack(before, AckStatus.UNKNOWN, URI), Ack(during, AckStatus.UNKNOWN, URI)]
    assert h.engine.pending_count == 1
    frames = reconnect(h)
    assert put_guids(frames) == [untouched]
    h.ack(before)  # a late ACK cannot report it twice
    assert h.statuses(before) == [AckStatus.UNKNOWN]


def test_queue_closed_while_disconnected_is_not_reopened(h: Harness) -> None:
    h.establish()
    closed = h.open_active(URI)
    h.open_active(OTHER)
    h.lose()
    h.engine.close_queue(closed)
    assert h.engine.queue(closed) is None  # forgotten, not just flagged
    frames = reconnect(h)
    assert [o.uri for o in opens_in(frames)] == [OTHER]
    assert h.events_of(QueueReopened) == [QueueReopened(OTHER)]


def test_post_on_a_closed_queue_raises_queue_not_open(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    h.engine.close_queue(queue_id)
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)
    assert h.engine.pending_count == 0


def test_close_in_flight_when_the_link_drops_completes_locally(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    request_id = h.engine.close_queue(queue_id)
    assert request_id is not None
    assert kinds(h.sent_frames()) == ["puts", "close_queue"]
    h.lose()
    assert h.outcomes(request_id) == [None]
    assert h.statuses(guid) == [AckStatus.UNKNOWN]
    assert opens_in(reconnect(h)) == []


def test_close_while_connected_is_sent_after_the_puts_posted_before_it(h: Harness) -> None:
    queue_id = writer(h)
    first, second = h.post(queue_id), h.post(queue_id)
    request_id = h.engine.close_queue(queue_id)
    frames = h.sent_frames()
    assert kinds(frames) == ["puts", "close_queue"]
    assert put_guids(frames) == [first, second]
    assert frames[1].close_queue.queue_id == queue_id

    h.ack(first, second)
    assert request_id is not None
    h.answer(frames[1].close_queue.request_id)
    assert h.outcomes(request_id) == [None]
    assert h.statuses(first) == h.statuses(second) == [AckStatus.SUCCESS]
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)


def test_post_while_a_close_is_in_flight_raises_queue_not_open(h: Harness) -> None:
    queue_id = writer(h)
    h.engine.close_queue(queue_id)
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)


# ========================================================================= rule 7: high watermark


def test_high_watermark_wait_is_five_seconds() -> None:
    assert HIGH_WATERMARK_WAIT == 5.0


def test_over_high_watermark_once_queued_bytes_reach_it() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.engine.transport_drained(10_000)  # the handshake frames are written
    assert not h.engine.over_high_watermark()
    h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    h.post(queue_id, b"x" * (399 - PUT_OVERHEAD))
    assert not h.engine.over_high_watermark()  # 999 bytes queued
    h.post(queue_id, b"x")  # 1040 bytes queued
    assert h.engine.over_high_watermark()


def test_high_watermark_is_reached_at_exactly_its_size() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.engine.transport_drained(10_000)
    h.post(queue_id, b"x" * (1000 - PUT_OVERHEAD))
    assert h.engine.over_high_watermark()


def test_bytes_taken_by_the_transport_count_until_drained() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.post(queue_id, b"x" * 2000)
    items = h.engine.take_outbound()
    assert h.engine.over_high_watermark()  # taken, not yet written
    # The shells drain by the bytes encode() accounts to each frame, as they are written.
    h.engine.transport_drained(sum(nbytes for _, nbytes in encode(items, 1024 * 1024)))
    assert not h.engine.over_high_watermark()


def test_never_over_high_watermark_while_disconnected() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.post(queue_id, b"x" * 2000)
    h.sent_frames()
    assert h.engine.over_high_watermark()
    h.lose()
    assert not h.engine.over_high_watermark()
    for _ in range(10):
        h.post(queue_id, b"x" * 2000)
        assert not h.engine.over_high_watermark()


# ================================================================================= bounded buffer


def test_disconnected_buffer_limit_refuses_the_put_and_keeps_nothing() -> None:
    h = Harness(max_disconnected_buffer_bytes=1000)
    queue_id = writer(h)
    h.lose()
    h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    with pytest.raises(BufferFullError):
        h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    assert h.engine.pending_count == 1
    assert h.acks == []
    assert len(put_guids(reconnect(h))) == 1


def test_disconnected_buffer_limit_does_not_bound_an_active_link() -> None:
    h = Harness(max_disconnected_buffer_bytes=1000)
    queue_id = writer(h)
    for _ in range(3):
        h.post(queue_id, b"x" * 600)
    assert h.engine.pending_count == 3


# ====================================================================================== bad input


@pytest.mark.parametrize(
    "uri",
    ["", "orders", "http://test/orders", "hf://test", "hf://test/", "hf:///orders", "hf://a/b/c"],
)
def test_open_with_an_invalid_uri_raises_invalid_queue_uri(h: Harness, uri: str) -> None:
    h.establish()
    with pytest.raises(InvalidQueueUriError):
        h.open_queue(uri)
    assert h.sent_frames() == []


def test_payload_limit_is_the_one_the_broker_announced(h: Harness) -> None:
    h.connect()
    h.answer_hello(max_payload_bytes=100)
    queue_id = h.open_active()
    with pytest.raises(PayloadTooLargeError):
        h.post(queue_id, b"x" * 101)
    assert h.engine.pending_count == 0
    h.post(queue_id, b"x" * 100)
    assert h.engine.pending_count == 1


@pytest.mark.parametrize(
    "properties",
    [
        {"count": 3},
        {"key": b"bytes"},
        {1: "int key"},
        {"a": "1", "b": "2", "c": "3"},  # over the announced max_properties=2
        {"big": "x" * 200},  # over the announced max_properties_bytes=100
    ],
)
def test_bad_properties_raise_invalid_properties(
    h: Harness, properties: dict[object, object]
) -> None:
    h.connect()
    h.answer_hello(max_properties=2, max_properties_bytes=100)
    queue_id = h.open_active()
    with pytest.raises(InvalidPropertiesError):
        h.post(queue_id, properties=properties)  # type: ignore[arg-type]
    assert h.engine.pending_count == 0
    assert h.sent_frames() == []


def test_properties_travel_with_the_put(h: Harness) -> None:
    queue_id = writer(h)
    h.post(queue_id, properties={"kind": "order", "region": "eu"})
    (put,) = puts_in(h.sent_frames())
    assert dict(put.properties) == {"kind": "order", "region": "eu"}


def test_post_to_a_read_only_queue_raises_not_writable(h: Harness) -> None:
    queue_id = reader(h)
    with pytest.raises(NotWritableError):
        h.post(queue_id)
    assert h.engine.pending_count == 0


def test_post_to_an_unknown_queue_raises_queue_not_open(h: Harness) -> None:
    h.establish()
    with pytest.raises(QueueNotOpenError):
        h.post(42)
    assert h.engine.pending_count == 0


def test_post_before_the_first_open_completes_raises_queue_not_open(h: Harness) -> None:
    h.establish()
    queue_id, _ = h.open_queue()
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)
    assert h.engine.pending_count == 0


def test_refused_first_open_completes_with_the_error(h: Harness) -> None:
    h.establish()
    queue_id, request_id = h.open_queue()
    h.answer_opens(h.sent_frames(), status=pb.STATUS_INVALID_ARGUMENT)
    (error,) = h.outcomes(request_id)
    assert isinstance(error, RequestFailedError)
    assert h.events_of(QueueReopened) == []
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)


# =============================================================================== protocol version


def test_hello_announces_protocol_version_and_client_id(h: Harness) -> None:
    h.connect()
    (hello,) = [f.hello for f in h.sent_frames()]
    assert hello.protocol_version == PROTOCOL_VERSION
    assert hello.client_id == "client-1"


def fail_with_other_version(h: Harness) -> None:
    h.answer_hello(protocol_version=PROTOCOL_VERSION + 1)


def fail_with_error_frame(h: Harness) -> None:
    h.feed(
        pb.ServerFrame(
            error=pb.Error(status=pb.STATUS_VERSION_MISMATCH, message="speak v2", fatal=True)
        )
    )


@pytest.mark.parametrize("mismatch", [fail_with_other_version, fail_with_error_frame])
def test_version_mismatch_fails_the_session(mismatch: Callable[[Harness], None]) -> None:
    h = Harness()
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.lose()
    h.connect()

    mismatch(h)

    assert h.state() is LinkState.FAILED
    assert isinstance(h.engine.failure, ProtocolVersionError)
    assert h.statuses(guid) == [AckStatus.UNKNOWN]
    assert isinstance(h.events[-1], SessionFailed)
    assert h.engine.pending_count == 0
    with pytest.raises(SessionClosedError):
        h.post(queue_id)
    with pytest.raises(SessionClosedError):
        h.engine.connection_made("broker-a:7700")


# ================================================================================== session close


def test_close_reports_pending_puts_unknown_and_emits_session_closed(h: Harness) -> None:
    queue_id = writer(h)
    acked, first, second = h.post(queue_id), h.post(queue_id), h.post(queue_id)
    h.ack(acked)
    h.engine.close()
    h.run_callbacks()
    assert h.statuses(first) == h.statuses(second) == [AckStatus.UNKNOWN]
    assert h.statuses(acked) == [AckStatus.SUCCESS]
    assert h.events[-1] == SessionClosed(unknown=2)
    assert h.state() is LinkState.CLOSED


def test_calls_after_close_raise_session_closed(h: Harness) -> None:
    queue_id = writer(h)
    h.engine.close()
    with pytest.raises(SessionClosedError):
        h.post(queue_id)
    with pytest.raises(SessionClosedError):
        h.open_queue(OTHER)
    with pytest.raises(SessionClosedError):
        h.engine.close_queue(queue_id)


def test_close_fails_requests_still_waiting(h: Harness) -> None:
    h.establish()
    _, request_id = h.open_queue()
    h.engine.close()
    h.run_callbacks()
    (error,) = h.outcomes(request_id)
    assert isinstance(error, SessionClosedError)


# ====================================================================================== consumers


def test_push_delivers_a_message_to_on_message(h: Harness) -> None:
    queue_id = reader(h)
    guid = h.push(queue_id, b"hello", properties={"k": "v"}, delivery_count=3)
    (message,) = h.messages
    assert isinstance(message, Message)
    assert message.guid == guid
    assert message.payload == b"hello"
    assert dict(message.properties) == {"k": "v"}
    assert message.delivery_count == 3
    assert message.queue_uri == URI


def test_push_for_a_closed_queue_is_dropped(h: Harness) -> None:
    queue_id = reader(h)
    request_id = h.engine.close_queue(queue_id)
    assert request_id is not None
    (close,) = [f.close_queue for f in h.sent_frames()]
    h.push(queue_id)  # while the close is in flight
    h.answer(close.request_id)
    h.push(queue_id)  # after it
    assert h.messages == []
    assert h.outcomes(request_id) == [None]


# ================================================================================ abandoned opens


def test_abandoned_open_is_closed_when_the_broker_opens_it(h: Harness) -> None:
    h.establish()
    queue_id, _ = h.open_queue()
    (sent,) = opens_in(h.sent_frames())
    h.engine.abandon_open(queue_id)

    h.answer(sent.request_id)

    (frame,) = h.sent_frames()
    assert frame.WhichOneof("frame") == "close_queue"
    assert frame.close_queue.queue_id == queue_id
    h.answer(frame.close_queue.request_id)
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)


def test_abandoned_open_that_the_broker_refused_sends_nothing(h: Harness) -> None:
    h.establish()
    queue_id, _ = h.open_queue()
    h.sent_frames()
    h.engine.abandon_open(queue_id)
    h.answer_opens(h.sent, status=pb.STATUS_INVALID_ARGUMENT)
    assert h.sent_frames() == []


def test_open_abandoned_while_disconnected_is_never_sent(h: Harness) -> None:
    queue_id, _ = h.open_queue()
    h.engine.abandon_open(queue_id)
    h.connect()
    h.answer_hello()
    assert opens_in(h.sent_frames()) == []
    assert h.state() is LinkState.ACTIVE


def test_abandoned_open_answered_last_still_restores_the_state(h: Harness) -> None:
    """A first open in flight during a restore, abandoned, then refused by the broker."""
    h.establish()
    kept = h.open_active(URI)
    guid = h.post(kept)
    h.lose()
    abandoned, _ = h.open_queue(OTHER)
    h.connect()
    h.answer_hello()
    reopen, first_open = opens_in(h.sent_frames())
    h.engine.abandon_open(abandoned)
    h.answer(reopen.request_id)
    h.answer(first_open.request_id, pb.STATUS_INVALID_ARGUMENT)
    assert h.state() is LinkState.ACTIVE
    assert put_guids(h.sent_frames()) == [guid]


def test_close_of_a_queue_whose_open_is_in_flight_undoes_the_open(h: Harness) -> None:
    """Closing before the first open is answered must not leave it open on the broker."""
    h.establish()
    queue_id, request_id = h.open_queue()
    (sent,) = opens_in(h.sent_frames())
    assert h.engine.close_queue(queue_id) is None
    h.run_callbacks()
    assert isinstance(h.outcomes(request_id)[0], QueueNotOpenError)

    h.answer(sent.request_id)

    (frame,) = h.sent_frames()
    assert frame.WhichOneof("frame") == "close_queue"
    assert frame.close_queue.queue_id == queue_id


def test_puts_of_a_queue_closing_during_the_restore_are_not_retransmitted(h: Harness) -> None:
    h.establish()
    closing = h.open_active(URI)
    h.open_active(OTHER)
    guid = h.post(closing)
    h.sent_frames()
    h.lose()
    h.connect()
    h.answer_hello()
    reopens = opens_in(h.sent_frames())
    h.answer(reopens[0].request_id)
    close_request = h.engine.close_queue(closing)
    assert close_request is not None
    h.answer(reopens[1].request_id)  # the restore finishes while the close is in flight

    frames = h.sent_frames()
    assert guid not in put_guids(frames)
    (close_frame,) = [f for f in frames if f.WhichOneof("frame") == "close_queue"]
    h.answer(close_frame.close_queue.request_id)
    assert h.statuses(guid) == [AckStatus.UNKNOWN]

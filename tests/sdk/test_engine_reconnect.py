"""Rule 4 (``docs/contract.md``) scripted against ``SessionEngine``: reconnect,
reopen in order, retransmit in post order, expiry by age."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch
from holdfast.sdk.engine import LinkState
from holdfast.sdk.errors import (
    QueueNotOpenError,
    RequestFailedError,
)
from holdfast.sdk.events import (
    Connected,
    ConnectionLost,
    QueueReopened,
    Reconnected,
    StateRestored,
)
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, AckStatus

from .fakes import URI, Harness, kinds, opens_in, put_guids, puts_in, reconnect, writer

OTHER = "hf://test/invoices"
THIRD = "hf://test/refunds"


@pytest.fixture
def h() -> Harness:
    return Harness()


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
    batch = ack_batch([(queue_id, guid.bytes, pb.STATUS_STORE_ERROR)])
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
    h.feed(pb.ServerFrame(acks=ack_batch([(0, guid.bytes, pb.STATUS_OK)])), generation=old)
    h.ack(guid)  # the broker recognised the replay: a success
    h.ack(guid)
    assert h.statuses(guid) == [AckStatus.SUCCESS]

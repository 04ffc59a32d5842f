"""Rules 5 and 6 (CONFIRM, CLOSE), consumers and abandoned opens, scripted against
``SessionEngine``."""

from __future__ import annotations

from typing import cast

import pytest

from holdfast.proto import pb
from holdfast.sdk.engine import LinkState, WirePushes
from holdfast.sdk.errors import (
    ConfirmDroppedError,
    QueueNotOpenError,
)
from holdfast.sdk.events import (
    ConfirmRejected,
    HandleConfirmRejected,
    QueueReopened,
)
from holdfast.sdk.types import Ack, AckStatus, Message
from tests.support.columns import PushView, confirms_of, push_batch_of

from .fakes import URI, Harness, kinds, opens_in, put_guids, reader, reconnect, writer

OTHER = "hf://test/invoices"
THIRD = "hf://test/refunds"


@pytest.fixture
def h() -> Harness:
    return Harness()


# ================================================================================ rule 5: CONFIRM


def test_confirm_while_connected_sends_a_confirm_batch(h: Harness) -> None:
    queue_id = reader(h)
    guid = h.push(queue_id)
    (message,) = h.messages
    message.confirm()
    (frame,) = h.sent_frames()
    assert frame.WhichOneof("frame") == "confirms"
    assert [(c.queue_id, c.guid) for c in confirms_of(frame.confirms)] == [(queue_id, guid.bytes)]


def test_confirm_while_disconnected_raises_confirm_dropped(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.lose()
    with pytest.raises(ConfirmDroppedError):
        h.messages[0].confirm()
    assert h.sent_frames() == []


def test_once_closing_begins_settlements_are_dropped_and_those_queued_before_leave(
    h: Harness,
) -> None:
    queue_id = reader(h)
    guids = [h.push(queue_id) for _ in range(3)]
    first, second, third = h.messages
    first.confirm()  # queued before close() began: it still leaves
    h.engine.begin_closing()
    with pytest.raises(ConfirmDroppedError, match="closing"):
        second.confirm()
    with pytest.raises(ConfirmDroppedError, match=r"REJECT .* closing"):
        third.reject()
    with pytest.raises(ConfirmDroppedError, match="closing"):
        h.engine.confirm_run(queue_id, [guids[1].bytes], h.generation)
    (frame,) = h.sent_frames()
    assert [c.guid for c in confirms_of(frame.confirms)] == [guids[0].bytes]


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


def test_a_proxy_upstream_hears_which_handle_a_refused_confirm_was_on() -> None:
    """The proxy tells only the client whose upstream handle it was: several clients
    may consume one queue, each on a handle of its own."""
    h = Harness(wire_pushes=True)
    reader(h)
    queue_id = h.open_active(URI, read=True, write=False)  # a second handle on URI
    guid = h.push(queue_id)
    h.feed(
        pb.ServerFrame(
            error=pb.Error(status=pb.STATUS_UNKNOWN_GUID, queue_id=queue_id, guids=[guid.bytes])
        )
    )
    assert h.events[-1] == HandleConfirmRejected(URI, (guid,), "UNKNOWN_GUID", queue_id)


def test_unsent_confirm_is_not_carried_over_a_drop(h: Harness) -> None:
    queue_id = reader(h)
    h.push(queue_id)
    h.messages[0].confirm()  # queued, not yet taken by the transport
    h.lose()
    frames = reconnect(h)
    assert "confirms" not in kinds(frames)


def test_wire_pushes_reach_on_message_as_the_push_and_its_generation() -> None:
    h = Harness(wire_pushes=True)
    queue_id = reader(h)
    guid = h.push(queue_id, b"hello", properties={"k": "v"}, delivery_count=3)
    (delivery,) = h.messages
    (push,), generation = cast(WirePushes, delivery)  # wire_pushes mode: not a Message
    assert (push.guid, push.payload, dict(push.properties)) == (guid.bytes, b"hello", {"k": "v"})
    assert push.delivery_count == 3
    assert generation == h.engine.generation


def test_wire_pushes_reach_on_message_by_runs_of_one_queue_in_order() -> None:
    h = Harness(wire_pushes=True)
    first = reader(h)
    second = h.open_active("hf://t/second", read=True, write=False)
    closed = h.open_active("hf://t/closed", read=True, write=False)
    h.engine.close_queue(closed)
    g = [bytes([i]) * 16 for i in range(6)]
    rows = [(first, 0), (first, 1), (closed, 2), (second, 3), (second, 4), (first, 5)]
    views = [PushView(q, g[n], b"%d" % n, {}, 1) for q, n in rows]
    h.feed(pb.ServerFrame(pushes=push_batch_of(views)))
    runs = [cast(WirePushes, delivery) for delivery in h.messages]
    assert [([p.guid for p in pushes], gen) for pushes, gen in runs] == [
        ([g[0], g[1]], h.generation),
        ([g[3], g[4]], h.generation),
        ([g[5]], h.generation),
    ]
    assert h.engine.stats().messages_delivered == 5


def test_confirm_wire_sends_a_confirm_for_the_current_connection_only() -> None:
    h = Harness(wire_pushes=True)
    queue_id = reader(h)
    guid = h.push(queue_id)
    (delivery,) = h.messages
    generation = cast(WirePushes, delivery)[1]
    h.engine.confirm_wire(queue_id, guid.bytes, generation)
    (frame,) = h.sent_frames()
    assert [(c.queue_id, c.guid) for c in confirms_of(frame.confirms)] == [(queue_id, guid.bytes)]
    h.lose()
    reconnect(h)
    with pytest.raises(ConfirmDroppedError, match="earlier connection"):
        h.engine.confirm_wire(queue_id, guid.bytes, generation)
    assert [f for f in h.sent_frames() if f.WhichOneof("frame") == "confirms"] == []


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

"""Scripted tests of the engine's guards: the state tables, rule 7 decided in the engine,
age on the wire, broker push-back, and frames from a server that break the protocol."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.sdk.engine import HIGH_WATERMARK_WAIT, LinkState, QueueState
from holdfast.sdk.errors import (
    BandwidthLimitError,
    BrokerBusyError,
    LocalProtocolError,
    RemoteProtocolError,
)
from holdfast.sdk.events import StateRestored
from holdfast.sdk.state import (
    LINK_TRANSITIONS,
    QUEUE_TRANSITIONS,
    LinkEvent,
    QueueEvent,
    next_link_state,
    next_queue_state,
)
from holdfast.sdk.types import AckStatus

from .fakes import Harness, put_guids, puts_in, reconnect

# ---------------------------------------------------------------------- the tables


def test_every_link_state_has_a_row_and_only_close_leaves_failed() -> None:
    assert set(LINK_TRANSITIONS) == set(LinkState)
    assert LINK_TRANSITIONS[LinkState.FAILED] == {LinkEvent.CLOSE: LinkState.CLOSED}
    assert LINK_TRANSITIONS[LinkState.CLOSED] == {}


@pytest.mark.parametrize(
    ("state", "event", "target"),
    [(s, e, t) for s, row in LINK_TRANSITIONS.items() for e, t in row.items()],
)
def test_every_legal_link_transition(state: LinkState, event: LinkEvent, target: LinkState) -> None:
    assert next_link_state(state, event) is target


@pytest.mark.parametrize(
    ("state", "event", "target"),
    [(s, e, t) for s, row in QUEUE_TRANSITIONS.items() for e, t in row.items()],
)
def test_every_legal_queue_transition(
    state: QueueState, event: QueueEvent, target: QueueState
) -> None:
    assert next_queue_state(state, event) is target


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in LinkState for e in LinkEvent if e not in LINK_TRANSITIONS[s]],
)
def test_a_link_event_missing_from_the_table_is_refused(state: LinkState, event: LinkEvent) -> None:
    with pytest.raises(LocalProtocolError, match=event.value):
        next_link_state(state, event)


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in QueueState for e in QueueEvent if e not in QUEUE_TRANSITIONS[s]],
)
def test_a_queue_event_missing_from_the_table_is_refused(
    state: QueueState, event: QueueEvent
) -> None:
    with pytest.raises(LocalProtocolError):
        next_queue_state(state, event)


def test_the_engine_walks_the_link_table_through_a_reconnect() -> None:
    h = Harness()
    seen = [h.state()]
    h.connect()
    seen.append(h.state())
    h.answer_hello()
    seen.append(h.state())
    h.lose()
    seen.append(h.state())
    h.connect()
    h.answer_hello()
    seen.append(h.state())
    assert seen == [
        LinkState.DISCONNECTED,
        LinkState.HANDSHAKING,
        LinkState.ACTIVE,  # nothing to reopen: the restore finishes at once
        LinkState.DISCONNECTED,
        LinkState.ACTIVE,
    ]


def test_connection_made_while_a_connection_is_live_is_a_local_protocol_error() -> None:
    h = Harness()
    h.establish()
    with pytest.raises(LocalProtocolError, match="connect"):
        h.engine.connection_made("broker-b:7700")
    assert h.state() is LinkState.ACTIVE  # refused, nothing changed


def test_a_frame_for_a_connection_never_made_is_a_local_protocol_error() -> None:
    h = Harness()
    h.establish()
    with pytest.raises(LocalProtocolError, match="never made"):
        h.feed(pb.ServerFrame(acks=pb.AckBatch()), generation=h.generation + 1)


def test_frames_of_a_lost_connection_are_stale_and_ignored() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    old = h.generation
    h.lose()
    h.ack(guid)  # generation is still the lost one: stale
    h.feed(pb.ServerFrame(acks=pb.AckBatch()), generation=old)
    assert h.engine.is_pending(guid)


# ---------------------------------------------------------------------- rule 7 in the engine


def test_admit_post_waits_while_over_the_watermark_then_refuses_at_five_seconds() -> None:
    h = Harness(high_watermark_bytes=1000)
    h.establish()
    queue_id = h.open_active()
    h.post(queue_id, b"x" * 1000)  # queued, not taken by the transport: over the watermark
    start = h.now
    assert h.engine.admit_post(start, start) == HIGH_WATERMARK_WAIT
    assert h.engine.admit_post(start, start + 4.9) == pytest.approx(0.1)
    with pytest.raises(BandwidthLimitError, match=r"1000 bytes.*not taken"):
        h.engine.admit_post(start, start + HIGH_WATERMARK_WAIT)
    assert h.engine.pending_count == 1  # the refused message was never buffered


def test_admit_post_lets_a_post_through_once_the_transport_drains() -> None:
    h = Harness(high_watermark_bytes=1000)
    h.establish()
    queue_id = h.open_active()
    h.post(queue_id, b"x" * 1000)
    assert h.engine.admit_post(h.now, h.now) > 0
    h.sent_frames()  # the transport takes it...
    h.engine.transport_drained(10_000)  # ...and sends it
    assert h.engine.admit_post(h.now, h.now + 1) == 0.0


def test_admit_post_never_waits_while_disconnected() -> None:
    h = Harness(high_watermark_bytes=10)
    h.establish()
    queue_id = h.open_active()
    h.lose()
    for _ in range(5):
        h.post(queue_id, b"x" * 100)
        assert h.engine.admit_post(h.now, h.now, queue_id) == 0.0


# ---------------------------------------------------------------------- age on the wire


def test_a_put_carries_its_age_at_the_moment_it_is_sent() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    h.lose()
    h.post(queue_id)
    h.advance(2.5)
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    (put,) = puts_in(h.sent_frames())
    assert put.age_ms == 2500


def test_a_relayed_put_keeps_the_age_it_arrived_with() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = uuid.uuid4()
    assert h.engine.relay(queue_id, b"m", None, guid.bytes, h.now, age_ms=7000)
    h.advance(0.5)
    (put,) = puts_in(h.sent_frames())
    assert put.age_ms == 7500  # not 500: the proxy does not restart the age


def test_a_relayed_put_already_past_the_window_is_unknown_on_reconnect_not_resent() -> None:
    h = Harness(now=5000.0)
    h.establish(window=10.0)
    queue_id = h.open_active()
    h.lose()
    old, young = uuid.uuid4(), uuid.uuid4()
    # Both arrive now; one was posted 9.5 s ago upstream of this hop, one 1 s ago.
    h.engine.relay(queue_id, b"old", None, old.bytes, h.now, age_ms=9500)
    h.engine.relay(queue_id, b"young", None, young.bytes, h.now, age_ms=1000)
    h.connect()
    h.answer_hello(window=10.0)
    h.answer_opens(h.sent_frames())
    assert put_guids(h.sent_frames()) == [young]
    assert h.statuses(old) == [AckStatus.UNKNOWN]
    assert h.events_of(StateRestored) == [StateRestored(retransmitted=1, expired=1)]


# ---------------------------------------------------------------------- broker statuses


def test_too_old_is_reported_unknown_and_conflict_as_conflict() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    old, clash = h.post(queue_id), h.post(queue_id)
    h.ack(old, status=pb.STATUS_TOO_OLD)
    h.ack(clash, status=pb.STATUS_CONFLICT)
    assert h.statuses(old) == [AckStatus.UNKNOWN]
    assert h.statuses(clash) == [AckStatus.CONFLICT]


def test_history_full_keeps_the_put_and_retransmits_it_after_the_back_off() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    h.sent_frames()
    h.ack(guid, status=pb.STATUS_HISTORY_FULL)
    assert h.statuses(guid) == []  # not an outcome
    assert h.engine.is_pending(guid)
    deadline = h.engine.next_deadline()
    assert deadline is not None and deadline > h.now
    h.engine.tick(h.now)  # too early: nothing is resent
    assert put_guids(h.sent_frames()) == []
    h.now = deadline
    h.engine.tick(h.now)
    assert put_guids(h.sent_frames()) == [guid]
    assert h.engine.next_deadline() is None
    h.ack(guid)
    assert h.statuses(guid) == [AckStatus.SUCCESS]


def test_a_queue_pushed_back_holds_posts_then_refuses_them_after_five_seconds() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    other = h.open_active("hf://test/other")
    guid = h.post(queue_id)
    h.ack(guid, status=pb.STATUS_HISTORY_FULL)
    start = h.now
    assert h.engine.admit_post(start, start, queue_id) == HIGH_WATERMARK_WAIT
    assert h.engine.admit_post(start, start, other) == 0.0  # only that queue waits
    with pytest.raises(BrokerBusyError, match="not taken"):
        h.engine.admit_post(start, start + HIGH_WATERMARK_WAIT, queue_id)


def test_the_push_back_doubles_its_delay_while_the_broker_stays_full() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    delays = []
    for _ in range(3):
        h.ack(guid, status=pb.STATUS_HISTORY_FULL)
        deadline = h.engine.next_deadline()
        assert deadline is not None
        delays.append(round(deadline - h.now, 3))
        h.now = deadline
        h.engine.tick(h.now)
        h.sent_frames()
    assert delays == [0.05, 0.1, 0.2]


def test_held_puts_are_retransmitted_by_the_restore_after_a_drop() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    h.ack(guid, status=pb.STATUS_HISTORY_FULL)
    h.lose()
    assert h.engine.next_deadline() is None
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    assert put_guids(h.sent_frames()) == [guid]


# ------------------------------------------------------------ frames a server must not send


def _push_with_guid(guid: bytes) -> pb.ServerFrame:
    batch = pb.PushBatch(queue_ids=[1], guids=guid, payloads=b"p", payload_lengths=[1])
    return pb.ServerFrame(pushes=batch)


def test_a_push_with_a_3_byte_guid_is_a_remote_protocol_error_and_nothing_is_delivered() -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active(read=True)
    # Two PUSHes whose GUID column is 16 + 3 bytes: the batch cannot be split.
    batch = pb.PushBatch(
        queue_ids=[queue_id],
        guids=uuid.uuid4().bytes + b"abc",
        payloads=b"okbad",
        payload_lengths=[2, 3],
    )
    with pytest.raises(RemoteProtocolError, match="guids are 19 bytes"):
        h.feed(pb.ServerFrame(pushes=batch))
    h.run_callbacks()
    assert h.messages == []  # the whole frame is refused, not half of it
    h.lose()  # the engine stays consistent: the shell drops the link and reconnects
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    assert h.state() is LinkState.ACTIVE


def test_an_ack_with_a_wrong_size_guid_is_a_remote_protocol_error() -> None:
    h = Harness()
    h.establish()
    h.open_active()
    batch = pb.AckBatch(queue_ids=[1], guids=b"\x01" * 20)
    with pytest.raises(RemoteProtocolError, match="guids are 20 bytes"):
        h.feed(pb.ServerFrame(acks=batch))


def test_a_second_hello_reply_and_frames_before_hello_are_remote_protocol_errors() -> None:
    h = Harness()
    h.connect()
    with pytest.raises(RemoteProtocolError, match="before HelloReply"):
        h.feed(pb.ServerFrame(acks=pb.AckBatch()))
    h.answer_hello()
    with pytest.raises(RemoteProtocolError, match="second HelloReply"):
        h.answer_hello()


def test_an_empty_server_frame_is_a_remote_protocol_error() -> None:
    h = Harness()
    h.establish()
    with pytest.raises(RemoteProtocolError, match="unknown kind"):
        h.feed(pb.ServerFrame())


# A byte that is no Status, none at all, a status that answers other frames, the gap at 26.
NOT_ACK_STATUSES = [200, pb.STATUS_UNSPECIFIED, pb.STATUS_MALFORMED_FRAME, 26]


@pytest.mark.parametrize("bad", NOT_ACK_STATUSES)
def test_an_ack_status_no_ack_carries_ends_the_connection_and_the_puts_are_sent_again(
    bad: int,
) -> None:
    """The whole batch is refused before any ACK of it is applied (its good ACKs too),
    the PUTs stay buffered, and the next connection sends them again (issue #33)."""
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guids = [h.post(queue_id) for _ in range(3)]
    assert put_guids(h.sent_frames()) == guids
    statuses = bytes([pb.STATUS_OK, bad, pb.STATUS_CONFLICT])
    packed = b"".join(g.bytes for g in guids)
    batch = pb.AckBatch(queue_ids=[queue_id], guids=packed, statuses=statuses)
    with pytest.raises(RemoteProtocolError, match=f"ACK 1 of 3 has status .*\\({bad}\\)"):
        h.feed(pb.ServerFrame(acks=batch))
    h.run_callbacks()
    assert h.acks == []
    assert h.engine.pending_count == 3
    h.lose()  # what the shell does on RemoteProtocolError
    assert put_guids(reconnect(h)) == guids
    h.ack(*guids, queue_id=queue_id)
    assert [h.statuses(g) for g in guids] == [[AckStatus.SUCCESS]] * 3

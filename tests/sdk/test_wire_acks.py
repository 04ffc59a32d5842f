"""``SessionEngine(wire_acks=True)``, the proxy's mode: PUT outcomes are handed over
as (GUID bytes, wire status) pairs instead of ``Ack`` callbacks, under the same rules."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.errors import (
    InvalidArgumentError,
    NotWritableError,
    QueueNotOpenError,
    RemoteProtocolError,
)
from holdfast.sdk.relaying import Relayed
from tests.support.columns import puts_of

from .fakes import Harness, put_guids, reconnect


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.engine = SessionEngine(
        client_id="proxy-1",
        on_event=harness._record_event,
        confirmer=harness._confirm,
        wire_acks=True,
    )
    return harness


def writer(h: Harness) -> int:
    h.establish()
    return h.open_active()


def test_acks_are_relayed_in_order_as_guid_and_wire_status(h: Harness) -> None:
    queue_id = writer(h)
    first, second, third = (h.post(queue_id, on_ack=h.record_ack) for _ in range(3))
    h.sent_frames()
    h.ack(second, first)
    h.ack(third, status=pb.STATUS_STORE_ERROR)
    assert h.engine.take_wire_acks() == [
        (second.bytes, pb.STATUS_OK),
        (first.bytes, pb.STATUS_OK),
        (third.bytes, pb.STATUS_STORE_ERROR),
    ]
    assert h.acks == []  # no Ack objects, no on_ack calls
    assert h.engine.pending_count == 0
    assert h.engine.take_wire_acks() == []


def test_a_duplicate_ack_is_relayed_once(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.ack(guid)
    h.ack(guid)
    assert h.engine.take_wire_acks() == [(guid.bytes, pb.STATUS_OK)]
    assert h.engine.stale_acks == 1


def test_puts_of_a_queue_closed_while_disconnected_are_relayed_unknown(h: Harness) -> None:
    queue_id = writer(h)
    guids = [h.post(queue_id) for _ in range(2)]
    h.lose()
    assert h.engine.close_queue(queue_id) is None
    assert h.engine.take_wire_acks() == [(g.bytes, pb.STATUS_UNKNOWN) for g in guids]


def test_closing_the_session_relays_every_pending_put_unknown(h: Harness) -> None:
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.engine.close()
    assert h.engine.take_wire_acks() == [(guid.bytes, pb.STATUS_UNKNOWN)]


def test_relay_judges_a_pending_guid_by_queue_and_content_as_the_broker_does(h: Harness) -> None:
    queue_id = writer(h)
    other = h.open_active("hf://t/other")
    guid = bytes(range(16))
    assert h.engine.relay(queue_id, b"one", None, guid, h.now) is Relayed.SENT
    assert h.engine.relay(queue_id, b"one", None, guid, h.now) is Relayed.JOINED
    assert h.engine.relay(queue_id, b"two", None, guid, h.now) is Relayed.CONFLICT
    assert h.engine.relay(queue_id, b"one", {"k": "v"}, guid, h.now) is Relayed.CONFLICT
    assert h.engine.relay(other, b"one", None, guid, h.now) is Relayed.BUSY
    assert h.engine.pending_count == 1


def test_relay_buffers_under_the_given_guid_bytes_once(h: Harness) -> None:
    queue_id = writer(h)
    guid = bytes(range(16))
    assert h.engine.relay(queue_id, b"one", None, guid, h.now) is Relayed.SENT
    assert h.engine.relay(queue_id, b"one", None, guid, h.now) is Relayed.JOINED
    puts = [p for f in h.sent_frames() if f.WhichOneof("frame") == "puts" for p in puts_of(f.puts)]
    assert [(p.guid, p.payload) for p in puts] == [(guid, b"one")]
    h.feed(pb.ServerFrame(acks=ack_batch([(queue_id, guid, pb.STATUS_OK)])))
    assert h.engine.take_wire_acks() == [(guid, pb.STATUS_OK)]
    assert h.engine.relay(queue_id, b"after the ACK", None, guid, h.now) is Relayed.SENT


@pytest.mark.parametrize("bad", [200, pb.STATUS_UNSPECIFIED, pb.STATUS_UNKNOWN_GUID])
def test_an_ack_status_no_ack_carries_is_never_relayed_the_puts_go_again(
    h: Harness, bad: int
) -> None:
    """A proxy must not relay a byte no ACK carries to its clients (as UNKNOWN or as it
    is): the connection ends with the batch unapplied, its PUTs are sent again on the
    next one, and their ACKs there are relayed (issue #33)."""
    queue_id = writer(h)
    guids = [bytes([i]) * 16 for i in range(3)]
    assert h.engine.relay_run(queue_id, guids, [b"a", b"b", b"c"], [0, 0, 0], h.now)
    h.sent_frames()
    batch = pb.AckBatch(
        queue_ids=[queue_id],
        guids=b"".join(guids),
        statuses=bytes([bad, pb.STATUS_OK, pb.STATUS_OK]),
    )
    with pytest.raises(RemoteProtocolError, match="ACK 0 of 3 has status"):
        h.feed(pb.ServerFrame(acks=batch))
    assert h.engine.take_wire_acks() == []
    assert h.engine.pending_count == 3
    h.lose()
    assert [g.bytes for g in put_guids(reconnect(h))] == guids
    h.feed(pb.ServerFrame(acks=ack_batch([(queue_id, g, pb.STATUS_OK) for g in guids])))
    assert h.engine.take_wire_acks() == [(g, pb.STATUS_OK) for g in guids]


def test_relay_refuses_a_guid_that_is_not_16_bytes(h: Harness) -> None:
    queue_id = writer(h)
    with pytest.raises(InvalidArgumentError):
        h.engine.relay(queue_id, b"x", None, b"short", h.now)
    assert h.engine.pending_count == 0


def test_relay_run_buffers_each_put_under_its_guid_as_old_as_it_arrived(h: Harness) -> None:
    queue_id = writer(h)
    guids = [bytes([i]) * 16 for i in range(4)]
    payloads = [b"a", b"bb", b"ccc", b"dddd"]
    assert h.engine.relay_run(queue_id, guids, payloads, [0, 1500, 1500, 20], h.now)
    assert h.engine.pending_count == 4
    h.advance(1.0)
    puts = [p for f in h.sent_frames() if f.WhichOneof("frame") == "puts" for p in puts_of(f.puts)]
    assert [(p.guid, p.payload) for p in puts] == list(zip(guids, payloads, strict=True))
    # Back-dated by its age (rounded down to the ms on the way out).
    expected = [1000, 2500, 2500, 1020]
    assert all(0 <= e - p.age_ms <= 1 for p, e in zip(puts, expected, strict=True)), puts
    assert h.engine.relay(queue_id, b"ccc", None, guids[2], h.now) is Relayed.JOINED
    h.feed(pb.ServerFrame(acks=ack_batch([(queue_id, g, pb.STATUS_OK) for g in guids])))
    assert h.engine.take_wire_acks() == [(g, pb.STATUS_OK) for g in guids]
    assert h.engine.relay_run(queue_id, guids[:1], [b"again"], [0], h.now)


def test_relay_run_while_disconnected_buffers_for_the_restore(h: Harness) -> None:
    queue_id = writer(h)
    h.lose()
    assert h.engine.relay_run(queue_id, [b"g" * 16], [b"x"], [0], h.now)
    assert h.engine.pending_count == 1 and not h.engine.has_outbound


@pytest.mark.parametrize("case", ["pending", "twice", "too large"])
def test_relay_run_takes_nothing_when_a_put_must_be_judged_alone(h: Harness, case: str) -> None:
    queue_id = writer(h)
    pending = b"p" * 16
    assert h.engine.relay(queue_id, b"x", None, pending, h.now) is Relayed.SENT
    h.sent_frames()
    guids = [b"a" * 16, b"b" * 16, b"c" * 16]
    payloads = [b"1", b"2", b"3"]
    if case == "pending":
        guids[1] = pending
    elif case == "twice":
        guids[2] = guids[0]
    else:
        payloads[1] = b"x" * (h.engine.limits.max_payload_bytes + 1)
    assert not h.engine.relay_run(queue_id, guids, payloads, [0, 0, 0], h.now)
    assert h.engine.pending_count == 1 and not h.engine.has_outbound
    # PUT by PUT, each is judged as before.
    assert h.engine.relay(queue_id, payloads[0], None, guids[0], h.now) is Relayed.SENT


def test_relay_run_refuses_a_queue_that_is_not_writable(h: Harness) -> None:
    writing = writer(h)
    reading = h.open_active("hf://t/read", read=True, write=False)
    with pytest.raises(NotWritableError):
        h.engine.relay_run(reading, [b"a" * 16], [b"x"], [0], h.now)
    with pytest.raises(QueueNotOpenError):
        h.engine.relay_run(999, [b"a" * 16], [b"x"], [0], h.now)
    assert h.engine.relay_run(writing, [], [], [], h.now)  # an empty run: nothing to do


def test_relay_run_keeps_to_the_disconnected_bound() -> None:
    h = Harness(max_disconnected_buffer_bytes=200)
    queue_id = writer(h)
    h.lose()
    assert not h.engine.relay_run(queue_id, [b"a" * 16, b"b" * 16], [b"x" * 100] * 2, [0, 0], h.now)
    assert h.engine.relay_run(queue_id, [b"a" * 16], [b"x" * 100], [0], h.now)
    assert h.engine.pending_count == 1

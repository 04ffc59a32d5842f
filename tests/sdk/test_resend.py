"""A proxy's retransmit after an outage (``holdfast.sdk.resend``): the restore queues
one ``ResendRun`` for the whole buffer, read out PUT by PUT as it is encoded, under the
rules of the PUT-by-PUT retransmit (rule 4: post order, the expiry horizon, closing
queues skipped, later posts after it)."""

from __future__ import annotations

from collections import deque

import pytest

from holdfast.proto import pb
from holdfast.sdk.frames import encode
from holdfast.sdk.outbound import Outbound
from holdfast.sdk.putbuffer import PUT_OVERHEAD, PutBuffer
from holdfast.sdk.resend import ResendRun, spans_to_resend
from tests.support.columns import puts_of

from .fakes import URI, Harness, put_guids, puts_in

OTHER = "hf://test/invoices"

MAX_BATCH_BYTES = 1 << 20


@pytest.fixture
def h() -> Harness:
    return Harness(wire_acks=True)


def test_a_proxys_restore_queues_one_run_not_a_tuple_a_put(h: Harness) -> None:
    h.establish()
    queue_id = h.open_active(URI)
    guids = [h.post(queue_id, b"p%d" % i) for i in range(500)]
    h.lose()
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    taken = h.engine.take_outbound()
    assert [type(item) for item in taken] == [ResendRun]
    sent = [frame for frame, _ in encode(taken, MAX_BATCH_BYTES, h.now)]
    assert put_guids(sent) == guids


def test_the_run_keeps_post_order_properties_and_ages_and_later_posts_follow_it(
    h: Harness,
) -> None:
    h.establish()
    first, second = h.open_active(URI), h.open_active(OTHER)
    a = h.post(first, b"a")
    b = h.post(second, b"b", properties={"k": "v"})
    c = h.post(first, b"c")
    h.ack(a)
    h.lose()
    h.advance(2.0)
    d = h.post(second, b"d")  # disconnected
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    e = h.post(first, b"e")  # after the restore: queued behind the run, once
    rows = puts_in(h.sent_frames())
    assert [row.guid for row in rows] == [b.bytes, c.bytes, d.bytes, e.bytes]
    assert [row.payload for row in rows] == [b"b", b"c", b"d", b"e"]
    assert [dict(row.properties) for row in rows] == [{"k": "v"}, {}, {}, {}]
    assert [row.age_ms for row in rows] == [2000, 2000, 0, 0]
    assert h.engine.pending_count == 4


def test_expired_puts_are_reported_unknown_and_not_in_the_run(h: Harness) -> None:
    h.establish()
    queue_id = h.open_active(URI)
    old = h.post(queue_id)
    h.advance(0.2)
    young = h.post(queue_id)
    h.lose()
    h.advance(8.9)
    frames = h.establish(window=10.0)
    assert put_guids(frames) == [young]
    assert h.engine.take_wire_acks() == [(old.bytes, pb.STATUS_UNKNOWN)]


def _buffer(count: int, size: int) -> PutBuffer:
    puts = PutBuffer(keyed=True)
    for i in range(count):
        guid = i.to_bytes(16, "big")
        puts.add(guid, 1, bytes(size), None, None, 0.0, size + PUT_OVERHEAD)
    return puts


def test_a_put_reported_before_it_is_encoded_is_not_sent_and_its_bytes_are_given_back() -> None:
    puts = _buffer(10, 100)
    outbound = Outbound(high_watermark=1 << 30)
    spans, expired, count, total = spans_to_resend(puts, horizon=-1.0, skip=frozenset())
    assert (expired, count, total) == ([], 10, 10 * (100 + PUT_OVERHEAD))
    outbound.add(ResendRun(spans, frozenset(), total, outbound), total)
    taken = outbound.take()
    puts.pop((3).to_bytes(16, "big"))  # reported (an ACK, a close) before its turn
    frames = list(encode(taken, MAX_BATCH_BYTES, 0.0))
    sent = [row.guid for frame, _ in frames for row in puts_of(frame.puts)]
    assert sent == [i.to_bytes(16, "big") for i in range(10) if i != 3]
    for _, nbytes in frames:
        outbound.drained(nbytes)
    assert outbound.transport_bytes == 0


def test_puts_of_closing_queues_are_skipped() -> None:
    puts = PutBuffer(keyed=True)
    for i in range(6):
        puts.add(i.to_bytes(16, "big"), 1 + i % 2, b"x", None, None, 0.0, 1 + PUT_OVERHEAD)
    skip = frozenset({2})
    spans, _, count, total = spans_to_resend(puts, horizon=-1.0, skip=skip)
    assert (count, total) == (3, 3 * (1 + PUT_OVERHEAD))
    run = ResendRun(spans, skip, total, Outbound(high_watermark=1 << 30))
    assert [put[0][-1] for put in run] == [0, 2, 4]


def test_the_run_lets_go_of_each_segment_once_it_has_read_it() -> None:
    """A segment whose PUTs were all sent and ACKed is dropped by the buffer; the run
    must not keep it (and its payloads) until the whole backlog has left."""
    puts = _buffer(3 * 4096, 8)  # three segments
    spans, _, _, total = spans_to_resend(puts, horizon=-1.0, skip=frozenset())
    assert len(spans) == 3
    run = ResendRun(spans, frozenset(), total, Outbound(high_watermark=1 << 30))
    assert len(list(encode(deque([run]), 1 << 16, 0.0))) > 3
    assert spans == []  # the run's own list, popped as it went

"""The sans-I/O rules of data streams (``holdfast.sdk.rpc.chunks``, ``.outgoing``,
``.incoming``) that both front-ends use: what a sender posts, and how a reader puts
deliveries in order, skips redeliveries and ends or fails a stream. No broker. The
rounds a redelivered request's reader asks for: ``test_stream_rounds.py``."""

from __future__ import annotations

import io
import uuid

import pytest

from holdfast.sdk import InvalidArgumentError, StreamError
from holdfast.sdk.rpc import chunks
from holdfast.sdk.rpc.incoming import Incoming, Verdict
from holdfast.sdk.rpc.outgoing import Outgoing
from holdfast.sdk.types import Ack, AckStatus, Message


def delivered(chunk: chunks.Chunk) -> Message:
    """``chunk`` as a reader gets it."""
    return Message(chunk.guid, chunk.payload, chunk.properties, 1, "hf://t/q", _noop, 1, 1)


def _noop(message: Message, reject: object = None) -> None:
    """A settler that sends nothing."""


def test_the_sender_numbers_chunks_and_derives_their_guids() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "data")
    first, second, end = out.data(b"ab"), out.data(b"cd"), out.data(b"")
    assert [c.properties[chunks.SEQ] for c in (first, second, end)] == ["0", "1", "2"]
    assert end.properties[chunks.END] == "1" and chunks.END not in first.properties
    assert first.guid == chunks.chunk_guid(guid, "data", 0)
    assert Outgoing(guid, "data").data(b"other").guid == first.guid  # a retransmit
    assert chunks.chunk_guid(guid, "other", 0) != first.guid


def test_a_refused_chunk_fails_the_sender() -> None:
    out = Outgoing(uuid.uuid4(), "data")
    chunk = out.data(b"x")
    out.on_ack(Ack(chunk.guid, AckStatus.SUCCESS, "hf://t/q"))
    out.check()
    out.on_ack(Ack(chunk.guid, AckStatus.CONFLICT, "hf://t/q"))
    with pytest.raises(StreamError, match="refused"):
        out.check()


def test_the_reader_reorders_and_skips_redeliveries() -> None:
    out = Outgoing(uuid.uuid4(), "data")
    zero, one, two, end = (delivered(out.data(d)) for d in (b"0", b"1", b"2", b""))
    reader = Incoming(uuid.uuid4(), "data")
    read = []
    for message in (one, zero, zero, two, one, end):
        verdict = reader.offer(message)
        taken = [message] if verdict is Verdict.NEXT else []
        while (early := reader.ready()) is not None:
            taken.append(early)
        for each in taken:
            reader.accept(each)
            read.append(reader.read_buffered(10))
    assert read == [b"0", b"1", b"2", b""]
    assert reader.done


def test_the_reader_fails_on_the_senders_failure() -> None:
    out = Outgoing(uuid.uuid4(), "data")
    chunk, own = out.failed(OSError("disk gone"))
    assert "disk gone" in str(own)
    reader = Incoming(uuid.uuid4(), "data")
    message = delivered(chunk)
    assert reader.offer(message) is Verdict.NEXT
    with pytest.raises(StreamError, match="the sender failed: disk gone"):
        reader.accept(message)
    assert reader.done


def test_names_are_checked_and_announced() -> None:
    assert chunks.check_names({"a": io.BytesIO(), "b.c-d_1": io.BytesIO()}) == ["a", "b.c-d_1"]
    properties = chunks.announce({}, ["a", "b"])
    assert chunks.parse_names(properties) == ["a", "b"]
    assert chunks.announce({}, []) == {}
    with pytest.raises(InvalidArgumentError):
        chunks.check_names({"a,b": io.BytesIO()})


class _Chunks:
    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration


@pytest.mark.parametrize("source", [b"abc", None, "text", 42], ids=repr)
def test_a_source_that_cannot_be_read_is_refused_before_anything_is_sent(source: object) -> None:
    """``streams={"x": b"abc"}`` was taken: the request went out, its handler ran, and
    only then did the stream fail (StreamError)."""
    with pytest.raises(InvalidArgumentError, match="stream 'x' must be a readable"):
        chunks.check_names({"x": source})
    assert chunks.check_names({"x": _Chunks()}) == ["x"]  # an async iterable is fine


def read_chunks(reader: Incoming, out: Outgoing, count: int) -> list[chunks.Chunk]:
    """Read ``count`` data chunks of ``out`` with ``reader``; the credits it gave."""
    credits = []
    for _ in range(count):
        message = delivered(out.data(b"x"))
        assert reader.offer(message) is Verdict.NEXT
        reader.accept(message)
        assert reader.read_buffered(10) == b"x"
        if (credit := reader.credit()) is not None:
            credits.append(credit)
    return credits


def test_the_sender_may_get_a_credit_window_ahead_of_the_reader() -> None:
    out = Outgoing(uuid.uuid4(), "data")
    for _ in range(chunks.CREDIT_WINDOW):
        assert out.may_send
        out.data(b"x")
    assert not out.may_send  # nothing read yet: the window is used up
    out.on_credit({chunks.CREDIT: "0"})
    assert out.may_send  # one read: one more
    out.data(b"x")
    assert not out.may_send


def test_the_reader_gives_credit_every_half_window_with_a_deterministic_guid() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "data")
    reader = Incoming(guid, "data")
    credits = read_chunks(reader, out, 3 * chunks.CREDIT_EVERY - 1)
    assert [c.properties[chunks.CREDIT] for c in credits] == [
        str(chunks.CREDIT_EVERY - 1),
        str(2 * chunks.CREDIT_EVERY - 1),
    ]
    first = credits[0]
    assert first.payload == b"" and first.properties[chunks.STREAM] == "data"
    assert chunks.CREDIT_STOP not in first.properties
    assert first.guid == chunks.credit_guid(guid, "data", chunks.CREDIT_EVERY - 1)
    assert first.guid != chunks.chunk_guid(guid, "data", chunks.CREDIT_EVERY - 1)
    # A second reader of the same stream (the same credits, retransmitted) derives the
    # same GUIDs, so the broker drops the copies.
    again = read_chunks(Incoming(guid, "data"), Outgoing(guid, "data"), 8)
    assert again[0].guid == first.guid


def test_the_sender_takes_the_highest_credit_whatever_the_order() -> None:
    out = Outgoing(uuid.uuid4(), "data")
    for _ in range(chunks.CREDIT_WINDOW + 20):
        out.data(b"x")
    out.on_credit({chunks.CREDIT: "19"})
    assert not out.may_send  # 36 posted, 20 read: the window is full
    out.on_credit({chunks.CREDIT: "20"})
    assert out.may_send
    out.data(b"x")
    assert not out.may_send
    out.on_credit({chunks.CREDIT: "7"})  # a late (redelivered) credit counts for nothing
    out.on_credit({chunks.CREDIT: "20"})  # nor does a repeat
    out.on_credit({chunks.CREDIT: "not a number"})
    out.on_credit({})
    assert not out.may_send
    out.on_credit({chunks.CREDIT: "21"})
    assert out.may_send


def test_a_sender_with_a_credit_timeout_gives_up_only_after_that_long_without_progress() -> None:
    now = [100.0]
    out = Outgoing(uuid.uuid4(), "data", credit_timeout=30.0, clock=lambda: now[0])
    for _ in range(chunks.CREDIT_WINDOW + 1):
        out.data(b"x")
    now[0] = 129.9
    assert out.credit_overdue() is None
    out.on_credit({chunks.CREDIT: "3"})  # progress: the wait starts again
    now[0] = 159.8
    assert out.credit_overdue() is None
    out.on_credit({chunks.CREDIT: "3"})  # a repeat is no progress
    out.on_credit({chunks.CREDIT: "2"})  # nor a late one
    now[0] = 159.9
    error = out.credit_overdue()
    assert isinstance(error, StreamError) and "no credit for 30 s" in str(error)
    now[0] = 259.8  # the wait is measured from the last progress, whatever the clock
    error = out.credit_overdue()
    assert isinstance(error, StreamError) and "no credit for 130 s" in str(error)
    endless = Outgoing(uuid.uuid4(), "data", clock=lambda: now[0])
    now[0] = 10_000.0
    assert endless.credit_overdue() is None  # a request's stream: its call bounds it


def test_a_reader_that_stops_early_tells_the_sender_once() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "data")
    reader = Incoming(guid, "data")
    read_chunks(reader, out, 3)
    last = reader.last_credit()
    assert last is not None
    assert last.properties[chunks.CREDIT] == "2" and last.properties[chunks.CREDIT_STOP] == "1"
    assert last.guid == chunks.credit_guid(guid, "data", 2, stop=True)
    assert last.guid != chunks.credit_guid(guid, "data", 2)
    assert reader.last_credit() is None  # once
    for _ in range(chunks.CREDIT_WINDOW):
        out.data(b"x")
    assert not out.may_send and not out.reader_stopped
    out.on_credit(last.properties)
    assert out.reader_stopped and out.may_send  # the wait ends: the sender stops


def test_a_reader_gives_no_credit_after_the_end_or_the_senders_failure() -> None:
    guid = uuid.uuid4()
    for last_chunk in ("end", "failed"):
        out = Outgoing(guid, "data")
        reader = Incoming(guid, "data")
        read_chunks(reader, out, chunks.CREDIT_EVERY - 1)
        final = out.data(b"") if last_chunk == "end" else out.failed(OSError("gone"))[0]
        message = delivered(final)
        assert reader.offer(message) is Verdict.NEXT
        if last_chunk == "end":
            reader.accept(message)
        else:
            with pytest.raises(StreamError):
                reader.accept(message)
        assert reader.credit() is None  # the sender sends nothing more: no credit due
        assert reader.last_credit() is None


def test_credit_queues_do_not_collide_with_stream_queues() -> None:
    guid = uuid.uuid4()
    assert chunks.credit_uri("d", guid, "x") != chunks.stream_uri("d", guid, "x")
    assert chunks.credit_uri("d", guid, "x") not in {
        chunks.stream_uri("d", guid, name) for name in ("x-credit", "credit-x", "x")
    }


def test_a_reader_owes_a_credit_once_it_has_read_at_least_credit_every_chunks() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "data")
    reader = Incoming(guid, "data")
    sent = [out.data(b"x") for _ in range(chunks.CREDIT_EVERY + 2)]
    for chunk in sent:  # the front-end asks only now, after more than CREDIT_EVERY
        message = reader.take(delivered(chunk))
        assert message is not None
        reader.accept(message)
    credit = reader.credit()
    assert credit is not None and credit.properties[chunks.CREDIT] == str(len(sent) - 1)


def test_a_reader_closed_before_reading_says_it_read_nothing() -> None:
    reader = Incoming(uuid.uuid4(), "data")
    assert reader.restart() is None  # a first delivery's reader asks for no round
    stop = reader.last_credit()
    assert stop is not None and stop.properties[chunks.CREDIT] == "-1"


def test_a_reader_holds_the_bytes_of_its_current_chunk_until_read() -> None:
    guid = uuid.uuid4()
    reader = Incoming(guid, "data")
    assert reader.buffered is False and reader.done is False
    message = reader.take(delivered(Outgoing(guid, "data").data(b"abc")))
    assert message is not None
    reader.accept(message)
    assert reader.buffered is True and reader.read_buffered(2) == b"ab"
    assert reader.buffered is True and reader.read_buffered(5) == b"c"
    assert reader.buffered is False and reader.read_buffered(5) == b""


def test_a_senders_failure_is_told_in_bounded_words() -> None:
    class AVeryLongErrorNameThatGoesOnAndOnWellPastTheSixtyFourCharactersAllowedError(Exception):
        pass

    out = Outgoing(uuid.uuid4(), "data")
    chunk, error = out.failed(
        AVeryLongErrorNameThatGoesOnAndOnWellPastTheSixtyFourCharactersAllowedError("w" * 900)
    )
    assert len(chunk.payload) == 500 and len(chunk.properties[chunks.ABORT]) == 64
    assert isinstance(error, StreamError) and "reading it failed" in str(error)


def test_a_long_streams_chunks_take_their_turn_by_value() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "data")
    reader = Incoming(guid, "data")
    for _ in range(300):  # sequence numbers past the small integers Python shares
        message = reader.take(delivered(out.data(b"x")))
        assert message is not None
        reader.accept(message)
        reader.read_buffered(1)
    assert reader.offer(delivered(out.data(b"y"))) is Verdict.NEXT


def test_a_reader_ends_at_a_stall_and_skips_what_is_no_chunk() -> None:
    reader = Incoming(uuid.uuid4(), "data")
    odd = chunks.Chunk(b"", {chunks.SEQ: "seven"}, uuid.uuid4())
    assert reader.offer(delivered(odd)) is Verdict.DROP
    error = reader.stalled(30.2)
    assert reader.done and "no chunk for 30.2 s" in str(error)

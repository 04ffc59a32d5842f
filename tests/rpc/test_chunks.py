"""The sans-I/O rules of data streams (``holdfast.sdk.rpc.chunks``) that both
front-ends use: what a sender posts, and how a reader puts deliveries in order,
skips redeliveries and ends or fails a stream. No broker."""

from __future__ import annotations

import uuid

import pytest

from holdfast.sdk import InvalidArgumentError, StreamError
from holdfast.sdk.rpc import chunks
from holdfast.sdk.types import Ack, AckStatus, Message


def delivered(chunk: chunks.Chunk) -> Message:
    """``chunk`` as a reader gets it."""
    return Message(chunk.guid, chunk.payload, chunk.properties, 1, "hf://t/q", _noop, 1, 1)


def _noop(message: Message, reject: object = None) -> None:
    """A settler that sends nothing."""


def test_the_sender_numbers_chunks_and_derives_their_guids() -> None:
    guid = uuid.uuid4()
    out = chunks.Outgoing(guid, "data")
    first, second, end = out.data(b"ab"), out.data(b"cd"), out.data(b"")
    assert [c.properties[chunks.SEQ] for c in (first, second, end)] == ["0", "1", "2"]
    assert end.properties[chunks.END] == "1" and chunks.END not in first.properties
    assert first.guid == chunks.chunk_guid(guid, "data", 0)
    assert chunks.Outgoing(guid, "data").data(b"other").guid == first.guid  # a retransmit
    assert chunks.chunk_guid(guid, "other", 0) != first.guid


def test_a_refused_chunk_fails_the_sender() -> None:
    out = chunks.Outgoing(uuid.uuid4(), "data")
    chunk = out.data(b"x")
    out.on_ack(Ack(chunk.guid, AckStatus.SUCCESS, "hf://t/q"))
    out.check()
    out.on_ack(Ack(chunk.guid, AckStatus.CONFLICT, "hf://t/q"))
    with pytest.raises(StreamError, match="refused"):
        out.check()


def test_the_reader_reorders_and_skips_redeliveries() -> None:
    out = chunks.Outgoing(uuid.uuid4(), "data")
    zero, one, two, end = (delivered(out.data(d)) for d in (b"0", b"1", b"2", b""))
    reader = chunks.Incoming("data")
    read = []
    for message in (one, zero, zero, two, one, end):
        verdict = reader.offer(message)
        taken = [message] if verdict is chunks.Verdict.NEXT else []
        while (early := reader.ready()) is not None:
            taken.append(early)
        for each in taken:
            reader.accept(each)
            read.append(reader.read_buffered(10))
    assert read == [b"0", b"1", b"2", b""]
    assert reader.done


def test_the_reader_fails_on_the_senders_failure() -> None:
    out = chunks.Outgoing(uuid.uuid4(), "data")
    chunk, own = out.failed(OSError("disk gone"))
    assert "disk gone" in str(own)
    reader = chunks.Incoming("data")
    message = delivered(chunk)
    assert reader.offer(message) is chunks.Verdict.NEXT
    with pytest.raises(StreamError, match="the sender failed: disk gone"):
        reader.accept(message)
    assert reader.done


def test_names_are_checked_and_announced() -> None:
    assert chunks.check_names({"a": 1, "b.c-d_1": 2}) == ["a", "b.c-d_1"]
    properties = chunks.announce({}, ["a", "b"])
    assert chunks.parse_names(properties) == ["a", "b"]
    assert chunks.announce({}, []) == {}
    with pytest.raises(InvalidArgumentError):
        chunks.check_names({"a,b": 1})

"""A closed stream reader behaves as a closed file: ``read``, ``readinto``,
``readline`` and iteration raise ``ValueError`` (never ``b""``, which would pass a cut
stream off as a whole one), threaded and asyncio, on the caller's reply streams and
the worker's request streams; ``readline`` reads lines across chunks."""

from __future__ import annotations

import asyncio
import io
import uuid

import pytest

from holdfast.sdk import Request, Session, StreamingReply, Worker, aio
from holdfast.sdk.aio.streams import AsyncStreamReader
from holdfast.sdk.rpc import chunks
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.reader import StreamReader
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

CLOSED = "I/O operation on closed file"


def refuses_every_read(reader: StreamReader) -> None:
    """Assert that each way of reading a closed ``reader`` raises ``ValueError``."""
    assert reader.closed
    with pytest.raises(ValueError, match=CLOSED):
        reader.read(10)
    with pytest.raises(ValueError, match=CLOSED):
        reader.read()
    with pytest.raises(ValueError, match=CLOSED):
        reader.readinto(bytearray(10))
    with pytest.raises(ValueError, match=CLOSED):
        reader.readline()
    with pytest.raises(ValueError, match=CLOSED):
        list(reader)


def post_stream(session: Session, guid: uuid.UUID, pieces: list[bytes]) -> None:
    """Post ``pieces`` as the chunks of stream ``data`` of call ``guid``, then its end."""
    queue = session.open_queue(chunks.stream_uri("test", guid, "data"), write=True)
    for seq, piece in enumerate(pieces):
        queue.post(piece, {chunks.STREAM: "data", chunks.SEQ: str(seq)})
    queue.post(b"", {chunks.STREAM: "data", chunks.SEQ: str(len(pieces)), chunks.END: "1"})
    assert session.flush(10)
    queue.close()


def test_a_reply_stream_read_after_close_raises_value_error(broker: BrokerProcess) -> None:
    uri = unique_uri("stream-closed")

    def handle(request: Request) -> StreamingReply:
        return StreamingReply(b"ok", {}, {"out": io.BytesIO(b"first\n" + bytes(3 * 2**20))})

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        reply = caller.request(uri, b"", timeout=60)
        reader = reply.streams["out"]
        assert reader.read(6) == b"first\n"
        reader.close()
        refuses_every_read(reader)


def test_a_request_stream_read_after_close_raises_value_error(broker: BrokerProcess) -> None:
    uri = unique_uri("stream-closed-request")
    seen: list[object] = []

    def handle(request: Request) -> bytes:
        reader = request.streams["data"]
        first: bytes = reader.read(5)
        reader.close()
        seen.append(reader.closed)
        for attempt in (lambda: reader.read(10), lambda: reader.readline(), lambda: list(reader)):
            try:
                seen.append(attempt())
            except ValueError as error:
                seen.append(str(error))
        return first

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        reply = caller.request(uri, b"", streams={"data": io.BytesIO(b"hello world")}, timeout=60)
    assert reply.payload == b"hello"
    assert seen == [True, CLOSED, CLOSED, CLOSED]


def test_readline_reads_lines_across_chunks(broker: BrokerProcess) -> None:
    guid = uuid.uuid4()
    with Session(broker.address, options=FAST) as session:
        post_stream(session, guid, [b"ab\ncd", b"ef\ng", b"hij"])
        with streaming.StreamReader(session, "test", guid, "data", stall_timeout=10) as reader:
            assert reader.readline() == b"ab\n"
            assert reader.readline(3) == b"cde"
            assert reader.readline() == b"f\n"
            assert reader.readline() == b"ghij"
            assert reader.readline() == b""
        refuses_every_read(reader)


def test_an_asyncio_reader_read_after_aclose_raises_value_error(broker: BrokerProcess) -> None:
    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as session:
            guid = uuid.uuid4()
            queue = await session.open_queue(chunks.stream_uri("test", guid, "data"), write=True)
            for seq in range(3):
                await queue.post(b"abc", {chunks.STREAM: "data", chunks.SEQ: str(seq)})
            reader = AsyncStreamReader(session, "test", guid, "data", stall_timeout=10)
            assert await reader.read(2) == b"ab"
            await reader.aclose()
            with pytest.raises(ValueError, match=CLOSED):
                await reader.read(10)
            with pytest.raises(ValueError, match=CLOSED):
                async for _ in reader:
                    pass
            assert reader.closed

    asyncio.run(run())


def test_an_asyncio_reader_at_its_end_is_not_closed(broker: BrokerProcess) -> None:
    """The end of a stream is not a close: ``async for`` ends, a read gives ``b""``."""

    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as session:
            guid = uuid.uuid4()
            queue = await session.open_queue(chunks.stream_uri("test", guid, "data"), write=True)
            await queue.post(b"abc", {chunks.STREAM: "data", chunks.SEQ: "0"})
            await queue.post(b"", {chunks.STREAM: "data", chunks.SEQ: "1", chunks.END: "1"})
            reader = AsyncStreamReader(session, "test", guid, "data", stall_timeout=10)
            assert [chunk async for chunk in reader] == [b"abc"]
            assert not reader.closed
            assert await reader.read(10) == b""

    asyncio.run(run())

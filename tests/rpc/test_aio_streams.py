"""Data streams of the asyncio request/reply API against a real broker: a stream each
way intact (SHA-256), from a file-like source (read in the executor) and from an
async iterable; a failing source failing the call and the handler's read with
``StreamError``; a stalled reader; cancellation of the awaiting task mid-stream; and
a threaded caller and worker talking to asyncio ones over the same wire."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from holdfast.sdk import (
    InvalidArgumentError,
    Request,
    Session,
    StreamError,
    StreamingReply,
    Worker,
    WorkerOptions,
    aio,
)
from holdfast.sdk.aio.streams import AsyncStreamReader
from holdfast.sdk.rpc import chunks
from tests.rpc.test_streams import MB, Source, digest_handler
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until_async

PIECES = (100_000, 700_000, 3)
"""Sizes of an async source's items: under, over (split) and far under a chunk."""


async def pieces_of(source: Source) -> AsyncIterator[bytes]:
    """``source`` as an async iterable of bytes, in items of varying sizes."""
    turn = 0
    while data := source.read(PIECES[turn % len(PIECES)]):
        turn += 1
        yield data


async def digest_stream(stream: AsyncStreamReader) -> tuple[int, str]:
    """Total size and SHA-256 of a stream read with ``async for``."""
    digest, total = hashlib.sha256(), 0
    async for chunk in stream:
        digest.update(chunk)
        total += len(chunk)
    return total, digest.hexdigest()


async def digest_by_reads(stream: AsyncStreamReader) -> tuple[int, str]:
    """The same, read with ``await stream.read(n)``."""
    digest, total = hashlib.sha256(), 0
    while chunk := await stream.read(64 * 1024):
        digest.update(chunk)
        total += len(chunk)
    return total, digest.hexdigest()


def digest_reply(sent: list[Source]) -> Callable[[Request], Awaitable[StreamingReply]]:
    """A handler that digests the request stream (``async for``) and answers with a
    stream of the size the caller asked for, from an async iterable (its source is
    appended to ``sent``, for its digest), and an empty one."""

    async def handle(request: Request) -> StreamingReply:
        total, hexdigest = await digest_stream(request.streams["data"])
        source = Source(int(request.properties.get("reply-size", "0")))
        sent.append(source)
        out = {"out": pieces_of(source), "empty": io.BytesIO()}
        return StreamingReply(f"{total}:{hexdigest}".encode(), {"kind": "echo"}, out)

    return handle


def test_a_20_mb_stream_each_way_arrives_intact(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams")
    size = 20 * MB + 17
    sent: list[Source] = []

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, digest_reply(sent)),
            aio.Session(broker.address, options=FAST) as caller,
        ):
            source = Source(20 * MB)  # file-like: read in the executor
            reply = await caller.request(
                uri,
                b"",
                properties={"reply-size": str(size)},
                streams={"data": source},
                timeout=300,
            )
            assert reply.payload.decode() == f"{20 * MB}:{source.digest.hexdigest()}"
            assert reply.properties == {"kind": "echo"}
            got = await digest_by_reads(reply.streams["out"])
            assert got == (size, sent[0].digest.hexdigest())
            assert await reply.streams["empty"].read() == b""

    asyncio.run(run())


def test_a_failing_source_fails_the_call_and_the_handlers_read(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams-fail")

    def die() -> None:
        raise OSError("disk gone")

    async def run() -> None:
        seen: list[BaseException] = []
        handled = asyncio.Event()

        async def handle(request: Request) -> bytes:
            try:
                total, _ = await digest_stream(request.streams["data"])
                return b"%d" % total
            except StreamError as error:
                seen.append(error)
                raise
            finally:
                handled.set()

        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle),
            aio.Session(broker.address, options=FAST) as caller,
        ):
            failing = pieces_of(Source(20 * MB, {3 * MB: die}))
            with pytest.raises(StreamError, match="disk gone"):
                await caller.request(uri, b"", streams={"data": failing}, timeout=60)
            await asyncio.wait_for(handled.wait(), 30)
        assert len(seen) == 1 and "disk gone" in str(seen[0])

    asyncio.run(run())


def test_a_failing_reply_source_fails_the_callers_reader(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams-reply-fail")

    def die() -> None:
        raise OSError("worker disk gone")

    async def handle(request: Request) -> StreamingReply:
        return StreamingReply(b"ok", {}, {"out": Source(10 * MB, {2 * MB: die})})

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle),
            aio.Session(broker.address, options=FAST) as caller,
        ):
            reply = await caller.request(uri, b"", timeout=60)
            assert reply.payload == b"ok"
            with pytest.raises(StreamError, match="worker disk gone"):
                await reply.streams["out"].read()

    asyncio.run(run())


def test_a_stalled_stream_fails_the_reader_with_stream_error(broker: BrokerProcess) -> None:
    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as session:
            guid = uuid.uuid4()
            uri = chunks.stream_uri("test", guid, "data")
            queue = await session.open_queue(uri, write=True)
            await queue.post(b"abc", {chunks.STREAM: "data", chunks.SEQ: "0"})
            reader = AsyncStreamReader(session, "test", guid, "data", stall_timeout=0.5)
            assert await reader.read(10) == b"abc"
            with pytest.raises(StreamError, match="no chunk"):
                await reader.read(10)

    asyncio.run(run())


def test_cancelling_the_awaiting_task_mid_stream_stops_sender_and_handler(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("aio-streams-cancel")

    async def run() -> None:
        reading, handler_cancelled, source_closed = (asyncio.Event() for _ in range(3))
        never = asyncio.Event()
        readers: list[AsyncStreamReader] = []

        async def slow_source() -> AsyncIterator[bytes]:
            try:
                for _ in range(4):
                    yield b"x" * chunks.CHUNK_SIZE
                await never.wait()  # a source with no more to give yet
                yield b"never sent"
            finally:
                source_closed.set()

        async def handle(request: Request) -> bytes:
            readers.append(request.streams["data"])
            assert await request.streams["data"].read(10) == b"x" * 10
            reading.set()
            try:
                await never.wait()
            except asyncio.CancelledError:
                assert request.cancelled.is_set()
                handler_cancelled.set()
                raise
            return b""

        options = aio_worker_options()
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle, options=options),
            aio.Session(broker.address, options=FAST) as session,
        ):
            call = asyncio.create_task(
                session.request(uri, b"", streams={"data": slow_source()}, timeout=60)
            )
            await asyncio.wait_for(reading.wait(), 20)
            caller = session._caller
            assert caller is not None
            # The cancel reaches the worker named by the call's first heartbeat.
            await wait_until_async(
                lambda: any(c.worker for c in caller._calls.values()), 10, "a heartbeat"
            )
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.wait_for(source_closed.wait(), 10)
            await asyncio.wait_for(handler_cancelled.wait(), 20)
            await wait_until_async(lambda: not caller._tasks, 10, "the sender task to end")
            await wait_until_async(
                lambda: readers[0]._queue is not None and not readers[0]._queue.is_open,
                10,
                "the handler's stream queue to close",
            )

    asyncio.run(run())


def aio_worker_options() -> WorkerOptions:
    """A first heartbeat after 50 ms, so a cancel can find the worker at once."""
    return WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)


def test_bad_stream_names_are_refused(broker: BrokerProcess) -> None:
    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as caller:
            with pytest.raises(InvalidArgumentError):
                await caller.request(unique_uri("x"), b"", streams={"a,b": Source(1)}, timeout=1)

    asyncio.run(run())


def test_threaded_caller_streams_to_an_asyncio_worker_and_back(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams-mixed")
    size = 4 * MB + 5
    sent: list[Source] = []

    def call() -> tuple[bytes, tuple[int, str], Source]:
        source = Source(6 * MB)
        with Session(broker.address, options=FAST) as caller:
            reply = caller.request(
                uri, b"", properties={"reply-size": str(size)}, streams={"data": source}
            )
            digest, total = hashlib.sha256(), 0
            for chunk in reply.streams["out"]:  # the threaded reader
                digest.update(chunk)
                total += len(chunk)
            assert reply.streams["empty"].read() == b""
        return reply.payload, (total, digest.hexdigest()), source

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, digest_reply(sent)),
        ):
            payload, got, source = await asyncio.to_thread(call)
            assert payload.decode() == f"{6 * MB}:{source.digest.hexdigest()}"
            assert got == (size, sent[0].digest.hexdigest())

    asyncio.run(run())


def test_asyncio_caller_streams_to_a_threaded_worker_and_back(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams-mixed-back")
    sent: list[Source] = []

    def handle(request: Request) -> StreamingReply:
        received = digest_handler(request)  # the threaded reader
        source = Source(5 * MB + 3)
        sent.append(source)
        return StreamingReply(received, {}, {"out": source})

    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as caller:
            source = Source(6 * MB)
            reply = await caller.request(uri, b"", streams={"data": pieces_of(source)}, timeout=120)
            assert reply.payload.decode() == f"{6 * MB}:{source.digest.hexdigest()}"
            got = await digest_stream(reply.streams["out"])
            assert got == (5 * MB + 3, sent[0].digest.hexdigest())

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
    ):
        asyncio.run(run())
    assert len(sent) == 1

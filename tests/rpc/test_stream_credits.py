"""Flow control of data streams by the reader's credits, against a real broker: a
reader that holds back (or a worker that has not picked up the request yet) stops the
sender at the credit window, so the stream's queue in the broker never holds more
than ``CREDIT_WINDOW`` chunks, whatever the size of the stream; on the threaded and
the asyncio API, request and reply streams. The content is checked by SHA-256 once
the reader goes on."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid

import pytest

from holdfast.sdk import Request, Session, StreamingReply, Worker, aio
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import QueueNotFoundError
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc.streams import StreamReader
from tests.rpc.test_streams import Source, digest_handler
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until, wait_until_async

SIZE = 40 * chunks.CHUNK_SIZE
"""10 MiB: far more than the credit window."""
SLACK = 1
"""Chunks over the window the checks allow (none expected)."""
HOLD = 1.0
"""Seconds the held reader is watched once the sender has used up its credit."""


class Watch:
    """The most a stream's queue held in the broker (ready and unconfirmed chunks), and
    how far its sender read its source, while the reader held back."""

    def __init__(self, admin: AdminClient, queue_uri: str, source: Source) -> None:
        self.admin, self.queue_uri, self.source = admin, queue_uri, source
        self.max_depth = 0

    def sample(self) -> None:
        """Note the queue's depth now. The sender opens the stream's queue a moment
        after the request is in its own queue: until then the stream holds nothing."""
        try:
            stats = self.admin.stats(self.queue_uri)
        except QueueNotFoundError:
            return
        self.max_depth = max(self.max_depth, stats.ready + stats.unconfirmed)

    def sender_at_the_window(self) -> bool:
        """Sample; True once the sender has read as much as its credit allows."""
        self.sample()
        return self.source.sent >= chunks.CREDIT_WINDOW * chunks.CHUNK_SIZE

    def hold(self) -> None:
        """Keep sampling for ``HOLD`` seconds, then check the bounds."""
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            self.sample()
            time.sleep(0.02)
        self.check()

    def check(self) -> None:
        """The queue and the sender stayed within the window."""
        bound = chunks.CREDIT_WINDOW + SLACK
        assert self.max_depth <= bound, f"{self.max_depth} chunks queued in the broker"
        assert self.source.sent <= bound * chunks.CHUNK_SIZE, f"{self.source.sent} bytes read"


def stream_queue(uri: str, guid: uuid.UUID, name: str) -> str:
    """The queue of stream ``name`` of a call (or reply) ``guid`` to the service ``uri``."""
    return chunks.stream_uri(calls.domain_of(uri), guid, name)


def digest_rest(stream: StreamReader, first: bytes) -> str:
    """``total:sha256`` of ``first`` and the rest of a threaded reader."""
    read = stream.read
    digest, total = hashlib.sha256(first), len(first)
    while chunk := read(64 * 1024):
        digest.update(chunk)
        total += len(chunk)
    return f"{total}:{digest.hexdigest()}"


def test_a_slow_request_reader_stops_the_sender_at_the_credit_window(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("credits-request")
    queues: list[str] = []
    held, release = threading.Event(), threading.Event()

    def handle(request: Request) -> bytes:
        queues.append(stream_queue(uri, request.guid, "data"))
        stream = request.streams["data"]
        first = stream.read(chunks.CHUNK_SIZE)
        held.set()
        assert release.wait(60)
        return digest_rest(stream, first).encode()

    source = Source(SIZE)
    with (
        AdminClient(broker.address) as admin,
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        future = caller.request_async(uri, b"", streams={"data": source}, timeout=120)
        wait_until(held.is_set, 30, "the handler's first read")
        watch = Watch(admin, queues[0], source)
        wait_until(watch.sender_at_the_window, 30, "the sender to use up its credit")
        watch.hold()
        release.set()
        reply = future.result(60)
    assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"
    print(f"max depth with a held request reader: {watch.max_depth} chunks")


def test_a_slow_reply_reader_stops_the_workers_sender_at_the_credit_window(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("credits-reply")
    queues: list[str] = []
    sources: list[Source] = []

    def handle(request: Request) -> StreamingReply:
        queues.append(stream_queue(uri, wire.reply_guid(request.guid), "out"))
        sources.append(Source(SIZE))
        return StreamingReply(b"ok", {}, {"out": sources[0]})

    with (
        AdminClient(broker.address) as admin,
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        reply = caller.request(uri, b"", timeout=60)
        first = reply.streams["out"].read(chunks.CHUNK_SIZE)
        watch = Watch(admin, queues[0], sources[0])
        wait_until(watch.sender_at_the_window, 30, "the sender to use up its credit")
        watch.hold()
        assert digest_rest(reply.streams["out"], first) == (
            f"{SIZE}:{sources[0].digest.hexdigest()}"
        )


def test_a_reader_that_closes_early_stops_the_workers_sender(broker: BrokerProcess) -> None:
    """The caller reads one chunk of a reply stream and closes it: its stop credit ends
    the worker's sender (which would otherwise wait for credit until the worker stops),
    and both ends close the credit queue."""
    uri = unique_uri("credits-close")
    replies = ReplyStreams("early")
    with (
        AdminClient(broker.address) as admin,
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, replies.handle),
        Session(broker.address, options=FAST) as caller,
    ):
        reply = caller.request(uri, b"", timeout=60)
        assert len(reply.streams["early"].read(chunks.CHUNK_SIZE)) == chunks.CHUNK_SIZE
        assert replies.sender_running()  # waiting for credit
        reply.streams["early"].close()
        wait_until(lambda: not replies.sender_running(), 30, "the sender to stop")
        credit_queue = replies.credit_queue(uri)
        wait_until(lambda: admin.stats(credit_queue).handles == 0, 30, "the credit queue closed")


def test_a_request_nobody_picked_up_yet_holds_its_stream_to_the_window(
    broker: BrokerProcess,
) -> None:
    """No worker yet: the stream waits in the broker, but only a window of it."""
    uri = unique_uri("credits-unpicked")
    source = Source(SIZE)
    with (
        AdminClient(broker.address) as admin,
        Session(broker.address, options=FAST) as caller,
    ):
        future = caller.request_async(uri, b"", streams={"data": source}, timeout=120)
        wait_until(lambda: admin.peek(uri), 30, "the request in its queue")
        (request,) = admin.peek(uri)
        watch = Watch(admin, stream_queue(uri, uuid.UUID(bytes=request.guid), "data"), source)
        wait_until(watch.sender_at_the_window, 30, "the sender to use up its credit")
        watch.hold()
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, digest_handler),
        ):
            reply = future.result(60)
    assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"


def test_a_slow_asyncio_reader_stops_the_sender_at_the_credit_window(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("credits-aio")
    guids: list[uuid.UUID] = []

    async def run() -> None:
        held, release = asyncio.Event(), asyncio.Event()

        async def handle(request: Request) -> StreamingReply:
            guids.append(request.guid)
            stream = request.streams["data"]
            digest = hashlib.sha256(first := await stream.read(chunks.CHUNK_SIZE))
            total = len(first)
            held.set()
            await release.wait()
            while chunk := await stream.read(64 * 1024):
                digest.update(chunk)
                total += len(chunk)
            out = Source(SIZE)
            sources.append(out)
            return StreamingReply(f"{total}:{digest.hexdigest()}".encode(), {}, {"out": out})

        sources: list[Source] = []
        source = Source(SIZE)
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle),
            aio.Session(broker.address, options=FAST) as caller,
        ):
            call = asyncio.ensure_future(
                caller.request(uri, b"", streams={"data": source}, timeout=120)
            )
            async with asyncio.timeout(30):
                await held.wait()
            with AdminClient(broker.address) as admin:
                # Request stream: the worker's reader holds back.
                watch = Watch(admin, stream_queue(uri, guids[0], "data"), source)
                await wait_until_async(
                    lambda: watch.source.sent >= chunks.CREDIT_WINDOW * chunks.CHUNK_SIZE,
                    30,
                    "the sender to use up its credit",
                )
                await asyncio.to_thread(watch.hold)
                release.set()
                reply = await call
                assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"
                # Reply stream: the caller's reader holds back.
                reader = reply.streams["out"]
                digest = hashlib.sha256(first := await reader.read(chunks.CHUNK_SIZE))
                reply_guid = wire.reply_guid(guids[0])
                back = Watch(admin, stream_queue(uri, reply_guid, "out"), sources[0])
                await wait_until_async(
                    lambda: back.source.sent >= chunks.CREDIT_WINDOW * chunks.CHUNK_SIZE,
                    30,
                    "the worker's sender to use up its credit",
                )
                await asyncio.to_thread(back.hold)
                total = len(first)
                while chunk := await reader.read(64 * 1024):
                    digest.update(chunk)
                    total += len(chunk)
                assert (total, digest.hexdigest()) == (SIZE, sources[0].digest.hexdigest())
        print(f"max depths with held asyncio readers: {watch.max_depth}, {back.max_depth}")

    asyncio.run(run())


def test_a_reply_stream_nobody_reads_is_given_up_after_the_credit_timeout(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that never reads (nor closes) a reply's stream does not keep the
    worker's sender waiting for ever: after ``REPLY_CREDIT_TIMEOUT`` without credit it
    fails (logged), its thread ends and the credit queue closes; on both APIs."""
    monkeypatch.setattr(chunks, "REPLY_CREDIT_TIMEOUT", 1.0)
    uri = unique_uri("credits-unread")
    replies = ReplyStreams("unread")
    with (
        AdminClient(broker.address) as admin,
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, replies.handle),
        Session(broker.address, options=FAST) as caller,
    ):
        reply = caller.request(uri, b"", timeout=60)
        credit_queue = replies.credit_queue(uri)
        wait_until(lambda: not replies.sender_running(), 30, "the threaded sender to give up")
        wait_until(lambda: admin.stats(credit_queue).handles == 0, 30, "its credit queue closed")
        del reply

    async def asyncio_worker() -> None:
        async def handle_async(request: Request) -> StreamingReply:
            return replies.handle(request)

        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle_async) as worker,
            aio.Session(broker.address, options=FAST) as caller,
        ):
            await caller.request(uri, b"", timeout=60)
            # The sender's task ends by itself (it is not cancelled by the worker's close).
            await wait_until_async(lambda: not worker._jobs, 30, "the asyncio sender to give up")
            assert admin.stats(replies.credit_queue(uri)).handles == 0  # its queue closed

    with AdminClient(broker.address) as admin:
        asyncio.run(asyncio_worker())


class ReplyStreams:
    """A handler answering each request with a reply stream ``name`` of ``SIZE`` bytes,
    and what the tests look at: the reply GUIDs, the sender thread, the credit queue."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.guids: list[uuid.UUID] = []

    def handle(self, request: Request) -> StreamingReply:
        """The worker's handler."""
        self.guids.append(wire.reply_guid(request.guid))
        return StreamingReply(b"ok", {}, {self.name: Source(SIZE)})

    def sender_running(self) -> bool:
        """True while a threaded worker's sender of the stream runs."""
        return any(t.name == f"holdfast-stream-{self.name}" for t in threading.enumerate())

    def credit_queue(self, uri: str) -> str:
        """The credit queue of the last reply's stream."""
        return chunks.credit_uri(calls.domain_of(uri), self.guids[-1], self.name)

"""What a data stream leaves behind when nobody reads it to the end, and how fast a
threaded reader learns that its call is over: a reader that stops early drains what
was delivered to it and what the sender posted, a cancelled call fails the handler's
``read`` at once, and a source that gives ``str`` fails both sides at once. Credits
the sender never took (given after it ended) expire (``chunks.CREDIT_TTL``, shortened
here) and leave their credit queue empty too."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import uuid

import pytest

from holdfast.sdk import (
    QueueNotFoundError,
    Request,
    RpcTimeoutError,
    Session,
    StreamError,
    StreamingReply,
    Worker,
    aio,
)
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.rpc import chunks, wire
from holdfast.sdk.rpc import streams as streaming
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until


def post_chunks(session: Session, guid: uuid.UUID, count: int) -> None:
    queue = session.open_queue(streaming.stream_uri("test", guid, "data"), write=True)
    for seq in range(count):
        queue.post(bytes(10), {streaming.STREAM: "data", streaming.SEQ: str(seq)})
    assert session.flush(10)
    queue.close()


def test_a_reader_that_stops_early_settles_what_was_delivered_to_it(
    broker: BrokerProcess,
) -> None:
    """Ten chunks; the reader (a window of eight unconfirmed) reads one and stops. The
    eight delivered and unread are confirmed, not given back (as delivered ones, which
    no pickup TTL expires), and the one never delivered is drained: none is left."""
    guid = uuid.uuid4()
    with Session(broker.address, options=FAST) as session:
        post_chunks(session, guid, 10)
        reader = streaming.StreamReader(session, "test", guid, "data", stall_timeout=10)
        assert reader.read(10) == bytes(10)
        wait_until(lambda: session.stats().messages_delivered >= 9, 10, "nine chunks delivered")
        reader.close()
        left = session.open_queue(streaming.stream_uri("test", guid, "data"), read=True)
        found = list(left.messages(timeout=1.0))
    assert found == []


def left_in(address: str, uri: str) -> int:
    """Messages ``uri`` holds, ready or unconfirmed (0 once the broker dropped it)."""
    with AdminClient(address) as admin:
        try:
            stats = admin.stats(uri)
        except QueueNotFoundError:
            return 0
    return stats.ready + stats.unconfirmed


@pytest.fixture
def short_credit_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credits expire after 1 s (60 s in use), so a test sees their queue empty."""
    monkeypatch.setattr(chunks, "CREDIT_TTL", 1.0, raising=False)


def credits_left(address: str, domain_uri: str, guid: uuid.UUID, name: str) -> int:
    """Messages left in the credit queue of stream ``name`` of call ``guid``."""
    return left_in(address, chunks.credit_uri(domain_uri.split("/")[2], guid, name))


@pytest.mark.parametrize("flavour", ["sync", "aio"])
@pytest.mark.usefixtures("short_credit_ttl")
def test_a_reply_stream_read_to_its_end_leaves_no_credit_behind(
    broker: BrokerProcess, flavour: str
) -> None:
    """A 3 MiB reply stream (12 chunks): the sender posts its end before the reader's
    credit for chunk 7 comes, so that credit is never taken; it used to stay for good."""
    uri = unique_uri("reply-credit")
    data = bytes(3 * 1024 * 1024)
    guids: list[uuid.UUID] = []

    def handle(request: Request) -> StreamingReply:
        guids.append(request.guid)
        return StreamingReply(b"r", {}, {"down": io.BytesIO(data)})

    async def handle_async(request: Request) -> StreamingReply:
        return handle(request)

    if flavour == "sync":
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle),
            Session(broker.address, options=FAST) as caller,
        ):
            assert caller.request(uri, b"", timeout=30).streams["down"].read() == data
    else:

        async def run() -> None:
            async with (
                aio.Session(broker.address, options=FAST) as worker_session,
                aio.Worker(worker_session, uri, handle_async),
                aio.Session(broker.address, options=FAST) as caller,
            ):
                reply = await caller.request(uri, b"", timeout=30)
                assert await reply.streams["down"].read() == data

        asyncio.run(run())
    reply_guid = wire.reply_guid(guids[0])
    wait_until(lambda: credits_left(broker.address, uri, reply_guid, "down") == 0, 15, "expiry")


@pytest.mark.parametrize("reads", [0, 300_000])
@pytest.mark.usefixtures("short_credit_ttl")
def test_a_handler_that_leaves_its_stream_unread_leaves_nothing_in_the_broker(
    broker: BrokerProcess, reads: int
) -> None:
    """A 10 MiB stream whose handler ignores it, or reads 300 KB of it: once the call is
    answered, the stream's queue is empty (it held up to 4 MiB for good before), and so
    is its credit queue."""
    uri = unique_uri("stream-unread")
    guids: list[uuid.UUID] = []

    def handle(request: Request) -> bytes:
        guids.append(request.guid)
        if reads:
            request.streams["data"].read(reads)
        return b"done"

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        data = io.BytesIO(bytes(10 * 1024 * 1024))
        assert caller.request(uri, b"", streams={"data": data}, timeout=60).payload == b"done"
        stream = streaming.stream_uri(uri.split("/")[2], guids[0], "data")
        wait_until(lambda: left_in(broker.address, stream) == 0, 15, "the stream drained")
        wait_until(lambda: credits_left(broker.address, uri, guids[0], "data") == 0, 15, "credits")


def credit_readers(address: str, uri: str, guid: uuid.UUID, name: str) -> int:
    """Handles open on the credit queue of stream ``name`` of call ``guid`` (its sender's)."""
    with AdminClient(address) as admin:
        try:
            return admin.stats(chunks.credit_uri(uri.split("/")[2], guid, name)).handles
        except QueueNotFoundError:
            return 0


@pytest.mark.usefixtures("short_credit_ttl")
def test_a_timed_out_upload_leaves_no_credit_behind(broker: BrokerProcess) -> None:
    """A call times out while its worker holds its upload unread: the caller's sender
    ends and closes the credit queue, then the worker's reader, closed when its handler
    returns, posts its stop there, for nobody. The stop expires."""
    uri = unique_uri("upload-timeout")
    guids: list[uuid.UUID] = []

    def handle(request: Request) -> bytes:
        guids.append(request.guid)
        assert request.cancelled.wait(10)
        wait_until(
            lambda: credit_readers(broker.address, uri, request.guid, "data") == 0,
            10,
            "the caller's sender gone",
        )
        return b""

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle) as worker,
        Session(broker.address, options=FAST) as caller,
    ):
        data = io.BytesIO(bytes(10 * 1024 * 1024))
        with pytest.raises(RpcTimeoutError):
            caller.request(uri, b"", streams={"data": data}, timeout=2)
        wait_until(lambda: worker.handler_runs == 1, 15, "the handler run")
        wait_until(lambda: credits_left(broker.address, uri, guids[0], "data") > 0, 15, "the stop")
        wait_until(lambda: credits_left(broker.address, uri, guids[0], "data") == 0, 15, "expiry")


def test_a_cancelled_call_fails_a_threaded_handlers_read_at_once(broker: BrokerProcess) -> None:
    """The caller's source gives one chunk and then blocks; the call is cancelled: the
    handler's ``read`` raises ``StreamError`` well before the 30 s stall timeout."""
    uri = unique_uri("stream-cancel")
    release = threading.Event()
    outcome: list[tuple[BaseException, float]] = []
    reading = threading.Event()

    class Slow:
        def __init__(self) -> None:
            self.sent = False

        def read(self, size: int = -1) -> bytes:
            if self.sent:
                release.wait(60)
                return b""
            self.sent = True
            return b"first"

    def handle(request: Request) -> bytes:
        reader = request.streams["data"]
        assert reader.read(5) == b"first"
        reading.set()
        started = time.monotonic()
        try:
            reader.read(5)
        except StreamError as error:
            outcome.append((error, time.monotonic() - started))
        return b""

    try:
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle, concurrency=1),
            Session(broker.address, options=FAST) as caller,
        ):
            future = caller.request_async(uri, b"", streams={"data": Slow()}, timeout=60)
            wait_until(reading.is_set, 20, "the handler reading")
            future.cancel()
            wait_until(lambda: bool(outcome), 15, "the handler's read to fail")
    finally:
        release.set()
    error, waited = outcome[0]
    assert "cancelled" in str(error) and waited < 10


def test_a_source_that_gives_str_fails_the_handlers_read_at_once(broker: BrokerProcess) -> None:
    uri = unique_uri("stream-str")
    seen: list[tuple[BaseException, float]] = []

    def handle(request: Request) -> bytes:
        started = time.monotonic()
        try:
            request.streams["data"].read()
        except StreamError as error:
            seen.append((error, time.monotonic() - started))
            raise
        return b""

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle),
        Session(broker.address, options=FAST) as caller,
    ):
        with pytest.raises(StreamError):
            text = io.StringIO("text, not bytes")
            caller.request(uri, b"", streams={"data": text}, timeout=30)  # type: ignore[dict-item]
        wait_until(lambda: bool(seen), 10, "the handler's read to fail")
    # The sender's failure, or the cancel of the call it failed, whichever came first.
    error, waited = seen[0]
    assert ("sender failed" in str(error) or "cancelled" in str(error)) and waited < 10


def test_an_asyncio_handler_that_leaves_its_stream_unread_leaves_nothing(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("aio-stream-unread")
    guids: list[uuid.UUID] = []

    async def handle(request: Request) -> bytes:
        guids.append(request.guid)
        await request.streams["data"].read(300_000)  # then returns: the rest is unread
        return b"done"

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as worker_session,
            aio.Worker(worker_session, uri, handle),
            aio.Session(broker.address, options=FAST) as caller,
        ):
            data = io.BytesIO(bytes(10 * 1024 * 1024))
            reply = await caller.request(uri, b"", streams={"data": data}, timeout=60)
            assert reply.payload == b"done"

    asyncio.run(run())
    stream = streaming.stream_uri(uri.split("/")[2], guids[0], "data")
    wait_until(lambda: left_in(broker.address, stream) == 0, 15, "the stream drained")


def test_every_credit_carries_the_pickup_ttl() -> None:
    """A stop, or a credit given after a killed or timed-out caller's sender ended,
    reaches nobody: its pickup TTL lets the broker drop it, and its queue."""
    from holdfast.proto.validate import PICKUP_TTL
    from holdfast.sdk.rpc.incoming import Incoming

    ttl = str(round(chunks.CREDIT_TTL * 1000))
    reader = Incoming(uuid.uuid4(), "data", epoch=1)
    restart, stop = reader.restart(), reader.last_credit()
    assert restart is not None and stop is not None
    assert restart.properties[PICKUP_TTL] == stop.properties[PICKUP_TTL] == ttl == "60000"

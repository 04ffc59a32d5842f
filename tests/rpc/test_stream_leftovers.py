"""What a data stream leaves behind when nobody reads it to the end, and how fast a
threaded reader learns that its call is over: chunks carry a pickup TTL, a reader
that stops early settles what was delivered to it, a cancelled call fails the
handler's ``read`` at once, and a source that gives ``str`` fails both sides at once."""

from __future__ import annotations

import io
import threading
import time
import uuid

import pytest

from holdfast.proto.validate import PICKUP_TTL
from holdfast.sdk import Request, Session, StreamError, Worker
from holdfast.sdk.rpc import chunks
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.incoming import Incoming
from holdfast.sdk.rpc.outgoing import Outgoing
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until


def test_a_requests_chunks_expire_after_its_call_and_a_replys_after_the_leftover_ttl() -> None:
    now = time.monotonic()
    request = Outgoing(uuid.uuid4(), "data", deadline=now + 10).data(b"x")
    ttl = int(request.properties[PICKUP_TTL]) / 1000
    assert 10 + chunks.REQUEST_CHUNK_SLACK - 1 < ttl <= 10 + chunks.REQUEST_CHUNK_SLACK
    reply = Outgoing(uuid.uuid4(), "data").data(b"")
    assert int(reply.properties[PICKUP_TTL]) == round(chunks.LEFTOVER_TTL * 1000)
    assert chunks.LEFTOVER_TTL > 2 * chunks.REPLY_CREDIT_TIMEOUT  # a live stream never expires
    incoming = Incoming(uuid.uuid4(), "data", epoch=1)
    restart = incoming.restart()
    assert restart is not None and PICKUP_TTL in restart.properties
    last = incoming.last_credit()
    assert last is not None and PICKUP_TTL in last.properties


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
    eight delivered and unread are confirmed, not given back as delivered ones (which
    the pickup TTL no longer expires); only the one never delivered is left."""
    guid = uuid.uuid4()
    with Session(broker.address, options=FAST) as session:
        post_chunks(session, guid, 10)
        reader = streaming.StreamReader(session, "test", guid, "data", stall_timeout=10)
        assert reader.read(10) == bytes(10)
        wait_until(lambda: session.stats().messages_delivered >= 9, 10, "nine chunks delivered")
        reader.close()
        left = session.open_queue(streaming.stream_uri("test", guid, "data"), read=True)
        found = list(left.messages(timeout=1.0))
    assert sorted(int(m.properties[streaming.SEQ]) for m in found) == [9]
    assert all(m.delivery_count == 1 for m in found)


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

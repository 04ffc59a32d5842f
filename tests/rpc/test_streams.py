"""Data streams of request/reply against a real broker: content intact (SHA-256),
a proxy restarted mid-stream without gaps or repeats, a failing sender failing the
call with ``StreamError`` on both sides."""

from __future__ import annotations

import hashlib
import io
import random
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from holdfast.sdk import Request, Session, StreamError, StreamingReply, Worker
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.chunks import CHUNK_SIZE
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

MB = 1024 * 1024


class Source:
    """A readable of ``size`` pseudo-random bytes; ``at(offset)`` hooks run once when a
    read first passes ``offset``; its SHA-256 is known once read."""

    def __init__(self, size: int, hooks: dict[int, Callable[[], None]] | None = None) -> None:
        self.size = size
        self.sent = 0
        self.digest = hashlib.sha256()
        self._block = random.Random(size).randbytes(MB + 4099)
        self._hooks = dict(hooks or {})

    def read(self, n: int = -1) -> bytes:
        n = min(n, self.size - self.sent)
        for offset in sorted(self._hooks):
            if self.sent >= offset:
                self._hooks.pop(offset)()
        start = self.sent % 4099
        data = self._block[start : start + n]
        self.sent += len(data)
        self.digest.update(data)
        return data


def digest_handler(request: Request) -> bytes:
    digest = hashlib.sha256()
    total = 0
    while chunk := request.streams["data"].read(64 * 1024):
        digest.update(chunk)
        total += len(chunk)
    return f"{total}:{digest.hexdigest()}".encode()


@pytest.fixture
def worker_session(broker: BrokerProcess) -> Iterator[Session]:
    with Session(broker.address, options=FAST) as session:
        yield session


def check_roundtrip(worker_session: Session, caller: Session, size: int) -> None:
    uri = unique_uri("streams")
    source = Source(size)
    with Worker(worker_session, uri, digest_handler):
        reply = caller.request(uri, b"", streams={"data": source}, timeout=300)
    assert reply.payload.decode() == f"{size}:{source.digest.hexdigest()}"


def test_request_stream_arrives_intact(worker_session: Session, broker: BrokerProcess) -> None:
    with Session(broker.address, options=FAST) as caller:
        check_roundtrip(worker_session, caller, 20 * MB)


@pytest.mark.slow
def test_request_stream_of_200_mb_arrives_intact(
    worker_session: Session, broker: BrokerProcess
) -> None:
    with Session(broker.address, options=FAST) as caller:
        check_roundtrip(worker_session, caller, 200 * MB)


def test_stream_survives_a_proxy_restart_without_gaps_or_repeats(
    worker_session: Session, broker: BrokerProcess
) -> None:
    uri = unique_uri("streams-proxy")
    with ProxyProcess(["--upstream", broker.address]) as proxy:

        def bounce() -> None:
            proxy.kill()
            proxy.restart()

        source = Source(20 * MB, {8 * MB: bounce})
        with (
            Worker(worker_session, uri, digest_handler),
            Session(proxy.address, options=FAST) as caller,
        ):
            reply = caller.request(uri, b"", streams={"data": source}, timeout=120)
        assert not source._hooks  # the proxy was restarted mid-stream
        assert reply.payload.decode() == f"{20 * MB}:{source.digest.hexdigest()}"


def test_a_sender_that_fails_mid_stream_fails_the_call_on_both_sides(
    worker_session: Session, broker: BrokerProcess
) -> None:
    uri = unique_uri("streams-fail")
    seen: list[BaseException] = []
    handled = threading.Event()

    def die() -> None:
        raise OSError("disk gone")

    def handle(request: Request) -> bytes:
        try:
            return digest_handler(request)
        except StreamError as error:
            seen.append(error)
            raise
        finally:
            handled.set()

    source = Source(20 * MB, {3 * MB: die})
    with Worker(worker_session, uri, handle), Session(broker.address, options=FAST) as caller:
        with pytest.raises(StreamError, match="disk gone"):
            caller.request(uri, b"", streams={"data": source}, timeout=60)
        wait_until(handled.is_set, timeout=30)
    assert len(seen) == 1 and "disk gone" in str(seen[0])


def test_a_stalled_stream_fails_the_reader_with_stream_error(broker: BrokerProcess) -> None:
    """A sender that went away sends nothing more: the reader gives up after its
    stall timeout instead of waiting for ever."""
    import uuid

    with Session(broker.address, options=FAST) as session:
        guid = uuid.uuid4()
        uri = streaming.stream_uri("test", guid, "data")
        queue = session.open_queue(uri, write=True)
        queue.post(b"abc", {streaming.STREAM: "data", streaming.SEQ: "0"})
        reader = streaming.StreamReader(session, "test", guid, "data", stall_timeout=0.5)
        assert reader.read(10) == b"abc"
        with pytest.raises(StreamError, match="no chunk"):
            reader.read(10)
        queue.close()


def test_bad_stream_names_are_refused(broker: BrokerProcess) -> None:
    from holdfast.sdk import InvalidArgumentError

    with Session(broker.address, options=FAST) as caller, pytest.raises(InvalidArgumentError):
        caller.request(unique_uri("x"), b"", streams={"a,b": Source(1)}, timeout=1)


def test_reply_streams_and_a_stream_each_way(
    worker_session: Session, broker: BrokerProcess
) -> None:
    uri = unique_uri("streams-reply")
    sources: list[Source] = []

    def handle(request: Request) -> StreamingReply:
        received = digest_handler(request)  # read the request stream first
        source = Source(20 * MB + 17)
        sources.append(source)
        return StreamingReply(received, {"kind": "echo"}, {"out": source, "empty": io.BytesIO()})

    source = Source(20 * MB)
    with Worker(worker_session, uri, handle), Session(broker.address, options=FAST) as caller:
        reply = caller.request(uri, b"", streams={"data": source}, timeout=120)
        assert reply.payload.decode() == f"{20 * MB}:{source.digest.hexdigest()}"
        assert reply.properties == {"kind": "echo"}
        digest = hashlib.sha256()
        for chunk in reply.streams["out"]:
            digest.update(chunk)
        assert digest.hexdigest() == sources[0].digest.hexdigest()
        assert reply.streams["empty"].read() == b""


def test_a_failing_reply_stream_fails_the_callers_reader(
    worker_session: Session, broker: BrokerProcess
) -> None:
    uri = unique_uri("streams-reply-fail")

    def die() -> None:
        raise OSError("worker disk gone")

    def handle(request: Request) -> StreamingReply:
        return StreamingReply(b"ok", {}, {"out": Source(10 * MB, {2 * MB: die})})

    with Worker(worker_session, uri, handle), Session(broker.address, options=FAST) as caller:
        reply = caller.request(uri, b"", timeout=60)
        with pytest.raises(StreamError, match="worker disk gone"):
            reply.streams["out"].read()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("resend", [False, True])
def test_a_sender_stops_reading_its_source_once_its_call_has_ended(
    broker: BrokerProcess, resend: bool
) -> None:
    # No reader: the credit window alone would let the sender read 16 chunks. The
    # call ends when 4 chunks are read; the sender must stop there, not at the window.
    ended = threading.Event()
    source = Source(40 * CHUNK_SIZE, {4 * CHUNK_SIZE: ended.set})
    with (
        Session(broker.address, options=FAST) as session,
        pytest.raises(StreamError, match="the call ended"),
    ):
        streaming.send(
            session, "streams", uuid.uuid4(), "data", source, ended.is_set, resend=resend
        )
    assert source.sent <= 5 * CHUNK_SIZE, f"{source.sent} bytes read after the call ended"


def test_a_reader_is_a_binary_file_for_the_standard_library(broker: BrokerProcess) -> None:
    """``hashlib.file_digest``, ``io.BufferedReader`` and ``with`` take a stream reader."""
    with Session(broker.address, options=FAST) as session:

        def by_file_digest(reader: streaming.StreamReader) -> str:
            return hashlib.file_digest(reader, "sha256").hexdigest()

        wrappers: list[io.BufferedReader] = []  # kept: collected, one closes its reader

        def buffered(reader: streaming.StreamReader) -> str:
            wrappers.append(io.BufferedReader(reader))  # type: ignore[arg-type]
            return hashlib.sha256(wrappers[-1].read()).hexdigest()

        for take in (by_file_digest, buffered):
            guid = uuid.uuid4()
            queue = session.open_queue(streaming.stream_uri("test", guid, "data"), write=True)
            data = random.Random(7).randbytes(3 * CHUNK_SIZE + 5)
            for seq, start in enumerate(range(0, len(data), CHUNK_SIZE)):
                chunk = data[start : start + CHUNK_SIZE]
                queue.post(chunk, {streaming.STREAM: "data", streaming.SEQ: str(seq)})
            ends = {streaming.STREAM: "data", streaming.SEQ: "4", streaming.END: "1"}
            queue.post(b"", ends)
            with streaming.StreamReader(session, "test", guid, "data") as reader:
                assert reader.readable() and not reader.seekable()
                assert take(reader) == hashlib.sha256(data).hexdigest()
                assert reader.read(10) == b""  # at its end
            assert reader.closed
            queue.close()

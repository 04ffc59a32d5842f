"""Data streams across outages on the *reading* side and of the broker itself: chunks
the broker redelivers after a proxy or a sqlite broker restart reach the reader once
each, in order (content checked by SHA-256), whether the outage hits the worker
reading a request stream, the caller reading a reply stream, or both senders and
readers at once; and a chunk whose CONFIRM is lost with the link is read once."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.sdk import Request, Session, StreamingReply, Worker
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.types import Message
from tests.rpc.test_streams import MB, Source
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

SIZE = 24 * MB


def reading_handler(at: int, outage: Callable[[], None]) -> Callable[[Request], bytes]:
    """A handler that digests its request stream and runs ``outage`` once, after it has
    read ``at`` bytes: the outage hits the reader mid-stream."""
    fired = threading.Event()

    def handle(request: Request) -> bytes:
        digest = hashlib.sha256()
        total = 0
        while chunk := request.streams["data"].read(64 * 1024):
            digest.update(chunk)
            total += len(chunk)
            if total >= at and not fired.is_set():
                fired.set()
                outage()
        assert fired.is_set()
        return f"{total}:{digest.hexdigest()}".encode()

    return handle


def test_worker_reading_through_a_restarted_proxy_gets_every_chunk_once(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("streams-reader-proxy")
    with ProxyProcess(["--upstream", broker.address]) as proxy:

        def bounce() -> None:
            proxy.kill()
            proxy.restart()

        source = Source(SIZE)
        with (
            Session(proxy.address, options=FAST) as worker_session,
            Worker(worker_session, uri, reading_handler(8 * MB, bounce)),
            Session(broker.address, options=FAST) as caller,
        ):
            reply = caller.request(uri, b"", streams={"data": source}, timeout=120)
            assert worker_session.stats().reconnects >= 1  # the reader lost its link
    assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"


def test_caller_reading_a_reply_stream_through_a_restarted_proxy(broker: BrokerProcess) -> None:
    uri = unique_uri("streams-reply-proxy")
    sent: list[Source] = []
    with ProxyProcess(["--upstream", broker.address]) as proxy:

        def handle(request: Request) -> StreamingReply:
            source = Source(SIZE)
            sent.append(source)
            return StreamingReply(b"ok", {}, {"out": source})

        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle),
            Session(proxy.address, options=FAST) as caller,
        ):
            reply = caller.request(uri, b"", timeout=60)
            digest, total = hashlib.sha256(), 0
            for chunk in reply.streams["out"]:
                if total < 8 * MB <= total + len(chunk):
                    proxy.kill()
                    proxy.restart()
                digest.update(chunk)
                total += len(chunk)
            assert caller.stats().reconnects >= 1  # the reader lost its link
    assert total == SIZE
    assert digest.hexdigest() == sent[0].digest.hexdigest()


@pytest.mark.timeout(240)
def test_stream_each_way_across_a_sqlite_broker_kill(tmp_path: Path) -> None:
    """SIGKILL of the sqlite broker while the worker reads the request stream: the
    caller's sender retransmits what was not ACKed (the broker's durable dedup drops
    what it had), the worker's reader skips the redeliveries it already read; then
    the reply stream crosses a second kill."""
    uri = unique_uri("streams-broker")
    with BrokerProcess(["--store", f"sqlite:{tmp_path / 'broker.db'}"]) as broker:

        def bounce() -> None:
            broker.kill()
            broker.restart()

        sent: list[Source] = []

        def handle(request: Request) -> StreamingReply:
            received = reading_handler(8 * MB, bounce)(request)
            source = Source(SIZE)
            sent.append(source)
            return StreamingReply(received, {}, {"out": source})

        source = Source(SIZE)
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle),
            Session(broker.address, options=FAST) as caller,
        ):
            reply = caller.request(uri, b"", streams={"data": source}, timeout=180)
            assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"
            digest, total = hashlib.sha256(), 0
            for chunk in reply.streams["out"]:
                if total < 8 * MB <= total + len(chunk):
                    bounce()
                digest.update(chunk)
                total += len(chunk)
            assert worker_session.stats().reconnects >= 2  # both kills
            assert caller.stats().reconnects >= 2
    assert total == SIZE
    assert digest.hexdigest() == sent[0].digest.hexdigest()


def test_a_chunk_whose_confirm_is_lost_with_the_link_is_read_once(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader takes chunk 1, then its link drops before it confirms it: the CONFIRM
    cannot leave (``ConfirmDroppedError``), the chunk is still read, and the broker's
    redelivery of it is skipped: neither a gap nor a repeat, and no error."""
    guid = uuid.uuid4()
    uri = streaming.stream_uri("test", guid, "data")
    chunks = [b"zero", b"one", b"two"]
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        with Session(broker.address, options=FAST) as sender:
            queue = sender.open_queue(uri, write=True)
            for seq, chunk in enumerate(chunks):
                queue.post(chunk, {streaming.STREAM: "data", streaming.SEQ: str(seq)})
            queue.post(b"", {streaming.STREAM: "data", streaming.SEQ: "3", streaming.END: "1"})
            assert sender.flush(10)
        with Session(proxy.address, options=FAST) as session:
            reader = streaming.StreamReader(session, "test", guid, "data", stall_timeout=20)
            assert reader.read(4) == b"zero"
            delivered = reader._next

            def cut_before_chunk_one(started: float) -> Message:
                message = delivered(started)
                if message.properties[streaming.SEQ] == "1" and not session.stats().reconnects:
                    proxy.kill()
                    proxy.restart()
                    wait_until(lambda: session.stats().reconnects >= 1, 20, "a reconnect")
                return message

            monkeypatch.setattr(reader, "_next", cut_before_chunk_one)
            assert reader.read() == b"onetwo"
            assert session.stats().reconnects >= 1

"""Data streams for request/reply: ``session.request(uri, payload, streams={name: f})``.

Each stream travels as ordinary messages on its own per-call queue
``hf://<domain>/rpc-stream-<request guid hex>-<name>``: chunks of ``CHUNK_SIZE`` bytes
whose GUIDs are derived from (request guid, stream name, sequence number), so a chunk
retransmitted after a reconnect is dropped by the broker's GUID dedup. Properties
carry the stream name, the sequence number and the end of the stream (or the
sender's failure). The receiver reads with a bounded ``max_unconfirmed_messages``
window, confirms a chunk once the reader has taken it, drops duplicates by sequence
number and reorders within the window. After a proxy or broker restart the broker
redelivers what was not confirmed (a CONFIRM lost with the link included): the reader
skips what it already read, so a stream has neither gaps nor repeats. The sender
keeps at most ``WINDOW`` chunks not yet acknowledged by the broker, so its memory
stays bounded whatever the size of the stream.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import StreamError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc.chunks import (
    ABORT,
    CHUNK_SIZE,
    END,
    NAMES,
    SEQ,
    STALL_TIMEOUT,
    STREAM,
    WINDOW,
    Incoming,
    Outgoing,
    Readable,
    check_names,
    chunk_guid,
    confirm_chunk,
    parse_names,
    stream_uri,
)
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.queue import Queue
    from holdfast.sdk.session import Session


def send(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    name: str,
    readable: Readable,
    stop: Callable[[], bool],
) -> None:
    """Post ``readable`` as stream ``name`` of ``request_guid``, in chunks, keeping at
    most ``WINDOW`` unacknowledged. Raises ``StreamError`` if the readable fails or
    the broker refuses a chunk (after telling the reader, when it can)."""
    queue = session.open_queue(stream_uri(domain, request_guid, name), write=True)
    credits = threading.Semaphore(WINDOW)
    out = Outgoing(request_guid, name)

    def on_ack(ack: Ack) -> None:
        out.on_ack(ack)
        credits.release()

    def wait_credit() -> None:
        while not credits.acquire(timeout=0.2):
            if stop():
                raise out.ended()

    try:
        while True:
            out.check()
            if stop():
                raise out.ended()
            try:
                data = readable.read(CHUNK_SIZE)
            except Exception as error:
                chunk, failure = out.failed(error)
                wait_credit()
                queue.post(chunk.payload, chunk.properties, on_ack, guid=chunk.guid)
                raise failure from error
            chunk = out.data(data)
            wait_credit()
            queue.post(chunk.payload, chunk.properties, on_ack, guid=chunk.guid)
            if not data:
                break
        # Hold the queue open until the broker has every chunk: closing it earlier
        # would report the unacknowledged ones UNKNOWN.
        for _ in range(WINDOW):
            wait_credit()
        out.check()
    finally:
        queue.close()


class StreamReader:
    """A request's incoming stream, as ``request.streams[name]``: binary file-like
    (``read(n)``, iteration over chunks). Thread-confined: one reader thread."""

    def __init__(
        self, session: Session, uri: str, name: str, stall_timeout: float = STALL_TIMEOUT
    ) -> None:
        self.name = name
        """The stream's name."""
        self._session = session
        self._uri = uri
        self._stall = stall_timeout
        self._queue: Queue | None = None
        self._messages: Iterator[Message] | None = None
        self._in = Incoming(name)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest with -1); ``b""`` at the end. Raises
        ``StreamError`` if the sender failed or the stream stalled."""
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        while not self._in.buffered and not self._in.done:
            self._take()
        return self._in.read_buffered(size)

    def __iter__(self) -> Iterator[bytes]:
        return iter(lambda: self.read(CHUNK_SIZE), b"")

    def close(self) -> None:
        """Stop reading; close the stream's queue (its unread chunks are dropped)."""
        self._in.close()
        if self._queue is not None and self._queue.is_open:
            self._queue.close()

    def _take(self) -> None:
        if self._messages is None:
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = self._session.open_queue(self._uri, read=True, options=options)
            self._messages = iter(self._queue.messages(timeout=self._stall))
        message = self._in.ready()
        while message is None:
            started = time.monotonic()
            got = next(self._messages, None)
            if got is None:
                error = self._in.stalled(time.monotonic() - started)
                self.close()
                raise error
            message = self._in.take(got)
        confirm_chunk(message)
        try:
            self._in.accept(message)
        finally:
            if self._in.done:
                self.close()


def start_senders(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    streams: Mapping[str, Readable],
    done: Callable[[], bool],
    fail: Callable[[StreamError], None],
) -> None:
    """Send each of ``streams`` on its own daemon thread until ``done()``; a stream
    that cannot complete calls ``fail`` with its ``StreamError``."""

    def run(name: str, readable: Readable) -> None:
        try:
            send(session, domain, request_guid, name, readable, done)
        except StreamError as error:
            if not done():
                fail(error)
        except Exception as error:  # the link or the queue failed under us
            if not done():
                fail(StreamError(f"stream {name}: {error}"))

    for name, readable in streams.items():
        thread = threading.Thread(
            target=run, args=(name, readable), name=f"holdfast-stream-{name}", daemon=True
        )
        thread.start()


def readers(
    session: Session, domain: str, request_guid: uuid.UUID, properties: Mapping[str, str]
) -> dict[str, StreamReader]:
    """The readers of the streams a request announces (each opens its queue lazily)."""
    return {
        name: StreamReader(session, stream_uri(domain, request_guid, name), name)
        for name in parse_names(properties)
    }


def close_all(streams: Mapping[str, Any]) -> None:
    """Close every reader of a finished request (its stream queues with them)."""
    for reader in streams.values():
        if isinstance(reader, StreamReader):
            reader.close()


__all__ = [
    "ABORT",
    "CHUNK_SIZE",
    "END",
    "NAMES",
    "SEQ",
    "STALL_TIMEOUT",
    "STREAM",
    "WINDOW",
    "Readable",
    "StreamReader",
    "check_names",
    "chunk_guid",
    "close_all",
    "parse_names",
    "readers",
    "send",
    "start_senders",
    "stream_uri",
]

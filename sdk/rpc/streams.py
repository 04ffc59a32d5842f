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

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from holdfast.sdk.errors import ConfirmDroppedError, InvalidArgumentError, StreamError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.queue import Queue
    from holdfast.sdk.session import Session

CHUNK_SIZE = 256 * 1024
"""Bytes per chunk message."""
WINDOW = 8
"""Chunks in flight per stream: unacknowledged by the broker on the sender, unconfirmed
on the receiver."""
STALL_TIMEOUT = 30.0
"""Seconds a reader waits for the next chunk before failing with ``StreamError``."""

NAMES = "x-rpc-streams"
"""Request property: the comma-separated names of the request's streams."""
STREAM = "x-rpc-stream"
SEQ = "x-rpc-seq"
END = "x-rpc-eos"
ABORT = "x-rpc-stream-abort"

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NAMESPACE = b"holdfast-rpc-stream/1:"


class Readable(Protocol):
    """What ``streams=`` takes: a binary file-like object."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes; ``b""`` at the end."""
        ...


def check_names(streams: Mapping[str, Readable] | None) -> list[str]:
    """The stream names of ``streams``; ``InvalidArgumentError`` for a bad name."""
    names = list(streams or {})
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"stream name {str(name)[:80]!r} must be 1-64 of [A-Za-z0-9_.-]"
            )
    return names


def parse_names(properties: Mapping[str, str]) -> list[str]:
    """The stream names a request announces (bad names are ignored)."""
    text = properties.get(NAMES, "")
    return [name for name in text.split(",") if _NAME.fullmatch(name)]


def stream_uri(domain: str, request_guid: uuid.UUID, name: str) -> str:
    """The queue carrying stream ``name`` of the call ``request_guid``."""
    return f"hf://{domain}/rpc-stream-{request_guid.hex}-{name}"


def chunk_guid(request_guid: uuid.UUID, name: str, seq: int) -> uuid.UUID:
    """The GUID of chunk ``seq`` of stream ``name``: the same on every retransmit."""
    return uuid.uuid5(request_guid, (_NAMESPACE + f"{name}/{seq}".encode()).hex())


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
    failures: list[str] = []

    def on_ack(ack: Ack) -> None:
        if ack.status is not AckStatus.SUCCESS:
            failures.append(str(ack.status))
        credits.release()

    def post(seq: int, payload: bytes, extra: dict[str, str]) -> None:
        while not credits.acquire(timeout=0.2):
            if stop():
                raise StreamError(f"stream {name}: the call ended")
        props = {STREAM: name, SEQ: str(seq), **extra}
        queue.post(payload, props, on_ack, guid=chunk_guid(request_guid, name, seq))

    seq = 0
    try:
        while True:
            if failures:
                raise StreamError(f"stream {name}: chunk refused ({failures[0]})")
            if stop():
                raise StreamError(f"stream {name}: the call ended")
            try:
                data = readable.read(CHUNK_SIZE)
            except Exception as error:
                post(seq, str(error)[:500].encode(), {ABORT: type(error).__name__[:64]})
                raise StreamError(f"stream {name}: reading it failed: {error}") from error
            if not data:
                post(seq, b"", {END: "1"})
                break
            post(seq, bytes(data), {})
            seq += 1
        # Hold the queue open until the broker has every chunk: closing it earlier
        # would report the unacknowledged ones UNKNOWN.
        for _ in range(WINDOW):
            while not credits.acquire(timeout=0.2):
                if stop():
                    raise StreamError(f"stream {name}: the call ended")
        if failures:
            raise StreamError(f"stream {name}: chunk refused ({failures[0]})")
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
        self._next = 0
        self._early: dict[int, Message] = {}  # later chunks, held until their turn
        self._buffer = memoryview(b"")
        self._done = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest with -1); ``b""`` at the end. Raises
        ``StreamError`` if the sender failed or the stream stalled."""
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        while not self._buffer and not self._done:
            self._take()
        data = bytes(self._buffer[:size])
        self._buffer = self._buffer[size:]
        return data

    def __iter__(self) -> Iterator[bytes]:
        return iter(lambda: self.read(CHUNK_SIZE), b"")

    def close(self) -> None:
        """Stop reading; close the stream's queue (its unread chunks are dropped)."""
        self._done = True
        if self._queue is not None and self._queue.is_open:
            self._queue.close()

    def _take(self) -> None:
        if self._messages is None:
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = self._session.open_queue(self._uri, read=True, options=options)
            self._messages = iter(self._queue.messages(timeout=self._stall))
        message = self._early.pop(self._next, None)
        while message is None:
            started = time.monotonic()
            got = next(self._messages, None)
            if got is None:
                self.close()
                waited = time.monotonic() - started
                raise StreamError(f"stream {self.name}: no chunk for {waited:.1f} s")
            try:
                seq = int(got.properties.get(SEQ, ""))
            except ValueError:
                _confirm(got)  # not a chunk of ours
                continue
            if seq < self._next or seq in self._early:
                _confirm(got)  # a duplicate
            elif seq == self._next:
                message = got
            else:
                self._early[seq] = got
        self._next += 1
        _confirm(message)
        properties = message.properties
        if ABORT in properties:
            self.close()
            text = message.payload.decode(errors="replace")
            raise StreamError(f"stream {self.name}: the sender failed: {text}")
        if END in properties:
            self.close()
            return
        self._buffer = memoryview(message.payload)


def _confirm(message: Message) -> None:
    """Confirm a chunk the reader has taken. A CONFIRM dropped with the link (or of a
    chunk delivered on an earlier connection) is fine: the chunk itself is read, and
    its redelivery is dropped as a duplicate by its sequence number."""
    with contextlib.suppress(ConfirmDroppedError):
        message.confirm()


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

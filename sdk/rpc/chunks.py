"""The rules of request/reply data streams, without I/O: what both front-ends share.

The threaded side (``holdfast.sdk.rpc.streams``, a thread per sender, blocking
readers) and the asyncio side (``holdfast.sdk.aio.streams``, tasks and awaited
readers) put the same chunks on the same queues through these: queue names, chunk
GUIDs and properties (``Outgoing``), and on the reading side the order, the
duplicates and the end or failure of a stream (``Incoming``); and the reader's
credits, which pace the sender to what the reader has read. Only waiting, for the
broker's ACKs, for credit or for the next chunk, is theirs.

Credits: a sender may post at most ``CREDIT_WINDOW`` chunks beyond the last one the
reader has read, so a slow reader (or a worker that has not picked up the request
yet) holds the stream's memory in the broker to that window, whatever the size of
the stream. The reader says how far it has read with small messages on the
stream's credit queue (``credit_uri``): after every ``CREDIT_EVERY`` chunks read,
a message with ``CREDIT`` = the sequence number of the last chunk read, and, when
it stops before the end of the stream, one more with ``CREDIT_STOP`` too, so the
sender stops instead of waiting for credit for as long as its call lives (a
worker's reply stream, which no call bounds on the worker's side, gives up after
``REPLY_CREDIT_TIMEOUT`` without new credit). A
credit's GUID is derived from (request guid, stream name, sequence number) like a
chunk's, so a credit retransmitted after a reconnect is dropped by the broker's
dedup; the sender takes the highest it has seen, since credits may come twice or
out of order after a reconnect.
"""

from __future__ import annotations

import contextlib
import enum
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from holdfast.sdk.errors import ConfirmDroppedError, InvalidArgumentError, StreamError
from holdfast.sdk.rpc import wire
from holdfast.sdk.types import Ack, AckStatus, Message

CHUNK_SIZE = 256 * 1024
"""Bytes per chunk message."""
WINDOW = 8
"""Chunks in flight per stream: unacknowledged by the broker on the sender, unconfirmed
on the receiver."""
CREDIT_WINDOW = 16
"""Chunks a sender may post beyond the last one the reader has read (16 chunks: 4 MiB
per stream); this bounds what a stream holds in the broker."""
CREDIT_EVERY = CREDIT_WINDOW // 2
"""Chunks read between two credits: half the window, so the sender gets more credit
before it runs out of it."""
CREDIT_CLOSE_WAIT = 5.0
"""Seconds a reader that closes waits for the broker to take its last credits (only
while its link is down does it wait at all: the same bound as the SDK's
high-watermark wait)."""
REPLY_CREDIT_TIMEOUT = 300.0
"""Seconds a worker's reply stream waits for new credit before it gives up with
``StreamError``: a caller that never reads (or closes) a reply's stream would
otherwise keep the worker's sender waiting until the worker stops. A request's
stream needs no such bound: its sender ends with its call."""
STALL_TIMEOUT = 30.0
"""Seconds a reader waits for the next chunk before failing with ``StreamError``."""

NAMES = "x-rpc-streams"
"""Request (or reply) property: the comma-separated names of its streams."""
STREAM = "x-rpc-stream"
"""Chunk property: the stream's name."""
SEQ = "x-rpc-seq"
"""Chunk property: the chunk's sequence number, from 0."""
END = "x-rpc-eos"
"""Chunk property: the stream ends here (an empty chunk)."""
ABORT = "x-rpc-stream-abort"
"""Chunk property: the sender failed (the type of its error; the payload says why)."""
CREDIT = "x-rpc-credit"
"""Credit property: the reader has read every chunk through this sequence number."""
CREDIT_STOP = "x-rpc-credit-stop"
"""Credit property: the reader stopped before the end; send nothing more."""


class Readable(Protocol):
    """A stream's source on either API: a binary file-like object."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes; ``b""`` at the end."""
        ...


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NAMESPACE = b"holdfast-rpc-stream/1:"


def check_names(streams: Mapping[str, Any] | None) -> list[str]:
    """The stream names of ``streams``; ``InvalidArgumentError`` for a bad name."""
    names = list(streams or {})
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"stream name {str(name)[:80]!r} must be 1-64 of [A-Za-z0-9_.-]"
            )
    return names


def parse_names(properties: Mapping[str, str]) -> list[str]:
    """The stream names a request or reply announces (bad names are ignored)."""
    text = properties.get(NAMES, "")
    return [name for name in text.split(",") if _NAME.fullmatch(name)]


def announce(properties: dict[str, str], names: list[str]) -> dict[str, str]:
    """``properties`` naming the streams ``names`` (unchanged without streams)."""
    if names:
        properties[NAMES] = ",".join(names)
    return properties


def streaming_reply_properties(
    request_guid: uuid.UUID, user: Mapping[str, str], streams: Mapping[str, Any]
) -> dict[str, str]:
    """The properties of a reply with data streams (a handler's ``StreamingReply``)."""
    names = check_names(streams)
    return announce(wire.reply_properties(request_guid, wire.check_user_properties(user)), names)


def stream_uri(domain: str, request_guid: uuid.UUID, name: str) -> str:
    """The queue carrying stream ``name`` of the call ``request_guid`` (for a reply's
    streams, the reply GUID)."""
    return f"hf://{domain}/rpc-stream-{request_guid.hex}-{name}"


def credit_uri(domain: str, request_guid: uuid.UUID, name: str) -> str:
    """The queue on which the reader of stream ``name`` gives its sender credit (the
    ``rpc-credit-`` prefix cannot collide with any stream's queue name)."""
    return f"hf://{domain}/rpc-credit-{request_guid.hex}-{name}"


def chunk_guid(request_guid: uuid.UUID, name: str, seq: int) -> uuid.UUID:
    """The GUID of chunk ``seq`` of stream ``name``: the same on every retransmit."""
    return uuid.uuid5(request_guid, (_NAMESPACE + f"{name}/{seq}".encode()).hex())


def credit_guid(request_guid: uuid.UUID, name: str, seq: int, stop: bool = False) -> uuid.UUID:
    """The GUID of the credit "read through ``seq``" of stream ``name`` (``stop``: the
    reader's last one): the same on every retransmit, never a chunk's."""
    what = f"{name}/credit/{seq}{'/stop' if stop else ''}"
    return uuid.uuid5(request_guid, (_NAMESPACE + what.encode()).hex())


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message of a stream, as it is posted."""

    payload: bytes
    properties: dict[str, str]
    guid: uuid.UUID


class Outgoing:
    """The sending side of one stream: its chunks in order, the broker's verdicts on
    them and the reader's credits. The front-end waits until ``may_send`` (credits
    come in through ``on_credit``), then reads the source and posts what
    ``data``/``failed`` give, keeping at most ``WINDOW`` chunks without their ACK
    (``on_ack`` counts them in); it stops quietly once ``reader_stopped``."""

    def __init__(
        self,
        request_guid: uuid.UUID,
        name: str,
        credit_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._guid = request_guid
        self._seq = 0
        self._refused: str | None = None
        self._read_through = -1
        self._credit_timeout = credit_timeout
        self._clock = clock
        self._credited_at = clock()
        self.reader_stopped = False
        """True once the reader said it stopped before the end: send nothing more."""

    @property
    def may_send(self) -> bool:
        """True when the next chunk is within ``CREDIT_WINDOW`` of what the reader has
        read (or the reader stopped, which ends the wait too)."""
        return self.reader_stopped or self._seq - self._read_through <= CREDIT_WINDOW

    def on_credit(self, properties: Mapping[str, str]) -> None:
        """Take a credit message's properties in. Credits may come twice or out of
        order (redelivered after a reconnect): the highest counts."""
        try:
            seq = int(properties.get(CREDIT, ""))
        except ValueError:
            return
        if seq > self._read_through:
            self._read_through = seq
            self._credited_at = self._clock()
        if CREDIT_STOP in properties:
            self.reader_stopped = True

    def data(self, data: bytes) -> Chunk:
        """The next chunk, carrying ``data`` (at most ``CHUNK_SIZE`` bytes); ``b""``
        gives the end of the stream."""
        return self._next(bytes(data), {} if data else {END: "1"})

    def failed(self, error: BaseException) -> tuple[Chunk, StreamError]:
        """The chunk telling the reader that reading the source raised ``error``, and
        the sender's own ``StreamError``."""
        chunk = self._next(str(error)[:500].encode(), {ABORT: type(error).__name__[:64]})
        return chunk, StreamError(f"stream {self.name}: reading it failed: {error}")

    def on_ack(self, ack: Ack) -> None:
        """Note the broker's verdict on a chunk (a refusal fails the stream)."""
        if ack.status is not AckStatus.SUCCESS and self._refused is None:
            self._refused = str(ack.status)

    def check(self) -> None:
        """``StreamError`` once the broker refused a chunk."""
        if self._refused is not None:
            raise StreamError(f"stream {self.name}: chunk refused ({self._refused})")

    def ended(self) -> StreamError:
        """The error of a stream whose call ended before it was sent."""
        return StreamError(f"stream {self.name}: the call ended")

    def credit_overdue(self) -> StreamError | None:
        """The error of a sender that waited ``credit_timeout`` seconds (since its start
        or the reader's last progress) without new credit; None while it may wait."""
        if self._credit_timeout is None:
            return None
        waited = self._clock() - self._credited_at
        if waited < self._credit_timeout:
            return None
        return StreamError(f"stream {self.name}: the reader gave no credit for {waited:.0f} s")

    def no_credit(self) -> StreamError:
        """The error of a stream whose credit queue closed under it (the session ended,
        or a reopen was refused): no credit can come any more."""
        return StreamError(f"stream {self.name}: its credit queue closed")

    def _next(self, payload: bytes, extra: dict[str, str]) -> Chunk:
        seq = self._seq
        self._seq += 1
        properties = {STREAM: self.name, SEQ: str(seq), **extra}
        return Chunk(payload, properties, chunk_guid(self._guid, self.name, seq))


def confirm_chunk(message: Message) -> None:
    """Confirm a chunk the reader has taken (or a credit the sender has taken). A
    CONFIRM dropped with the link (or of a message delivered on an earlier
    connection) is fine: the chunk itself is read, and its redelivery is dropped as a
    duplicate by its sequence number (a credit's counts once, the highest winning)."""
    with contextlib.suppress(ConfirmDroppedError):
        message.confirm()


class Verdict(enum.Enum):
    """What a reader does with a chunk delivered to it (``Incoming.offer``)."""

    NEXT = "next"
    """Its turn: read it now."""
    HOLD = "hold"
    """Early: kept until its turn (not confirmed yet, so within the window)."""
    DROP = "drop"
    """Read before (a redelivery), or not a chunk: confirm it and skip it."""


class Incoming:
    """The reading side of one stream: puts the delivered chunks back in order, skips
    redeliveries by sequence number, and holds the bytes not read yet. After a
    reconnect the broker redelivers what was not confirmed (a CONFIRM lost with the
    link included), so a chunk may come twice and out of order: neither a gap nor a
    repeat reaches the reader. ``credit`` and ``last_credit`` give the credits the
    front-end posts on the stream's credit queue."""

    def __init__(self, request_guid: uuid.UUID, name: str) -> None:
        self.name = name
        self.done = False
        """True once the stream ended, failed or was closed."""
        self._guid = request_guid
        self._next = 0
        self._early: dict[int, Message] = {}
        self._buffer = memoryview(b"")
        self._read_through = -1
        self._credited = -1
        self._finished = False  # the sender's end or failure was read: it sends no more
        self._stop_sent = False

    @property
    def buffered(self) -> bool:
        """True while bytes of the current chunk are unread."""
        return bool(self._buffer)

    def read_buffered(self, size: int) -> bytes:
        """Up to ``size`` of the bytes not read yet (``b""`` when none)."""
        data = bytes(self._buffer[:size])
        self._buffer = self._buffer[size:]
        return data

    def ready(self) -> Message | None:
        """The held chunk whose turn it is, if it came early (its turn is then taken)."""
        message = self._early.pop(self._next, None)
        if message is not None:
            self._next += 1
        return message

    def offer(self, message: Message) -> Verdict:
        """Sort a delivered chunk: ``NEXT`` takes its turn."""
        try:
            seq = int(message.properties.get(SEQ, ""))
        except ValueError:
            return Verdict.DROP
        if seq < self._next or seq in self._early:
            return Verdict.DROP
        if seq > self._next:
            self._early[seq] = message
            return Verdict.HOLD
        self._next += 1
        return Verdict.NEXT

    def take(self, message: Message) -> Message | None:
        """``offer`` a delivered chunk and settle what is not read: a duplicate or a
        stranger is confirmed and dropped, an early one held (None); the chunk whose
        turn it is comes back, to be ``accept``ed."""
        verdict = self.offer(message)
        if verdict is Verdict.DROP:
            confirm_chunk(message)
        return message if verdict is Verdict.NEXT else None

    def accept(self, message: Message) -> None:
        """Take the chunk whose turn it is: its bytes are buffered, or the stream ends;
        ``StreamError`` if the sender failed."""
        properties = message.properties
        with contextlib.suppress(ValueError):
            self._read_through = int(properties.get(SEQ, ""))
        if ABORT in properties or END in properties:
            self._finished = True
        if ABORT in properties:
            self.done = True
            text = message.payload.decode(errors="replace")
            raise StreamError(f"stream {self.name}: the sender failed: {text}")
        if END in properties:
            self.done = True
            return
        self._buffer = memoryview(message.payload)

    def credit(self) -> Chunk | None:
        """The credit to post now, if one is due: every ``CREDIT_EVERY`` chunks read
        (none once the sender has sent its last chunk)."""
        if self._finished or self._read_through - self._credited < CREDIT_EVERY:
            return None
        self._credited = self._read_through
        return self._credit(self._read_through, stop=False)

    def last_credit(self) -> Chunk | None:
        """The credit to post when the reader stops before the end of the stream (once):
        it tells the sender to stop. None after the end or the sender's failure."""
        if self._finished or self._stop_sent:
            return None
        self._stop_sent = True
        return self._credit(self._read_through, stop=True)

    def _credit(self, seq: int, stop: bool) -> Chunk:
        properties = {STREAM: self.name, CREDIT: str(seq)}
        if stop:
            properties[CREDIT_STOP] = "1"
        return Chunk(b"", properties, credit_guid(self._guid, self.name, seq, stop))

    def stalled(self, waited: float) -> StreamError:
        """The error of a stream that brought no chunk for ``waited`` seconds."""
        self.done = True
        return StreamError(f"stream {self.name}: no chunk for {waited:.1f} s")

    def close(self) -> None:
        """Stop: whatever is held or buffered is dropped."""
        self.done = True
        self._early.clear()
        self._buffer = memoryview(b"")

"""The reading side of one data stream, without I/O: delivered chunks back in order,
redeliveries skipped, the bytes not read yet held, the credits to give and, for a
redelivered request, the round to ask for (``holdfast.sdk.rpc.chunks``, "Rounds").
Both front-ends (``holdfast.sdk.rpc.streams``, ``holdfast.sdk.aio.streams``) use it."""

from __future__ import annotations

import contextlib
import enum
import uuid

from holdfast.proto.validate import PICKUP_TTL
from holdfast.sdk.errors import StreamError
from holdfast.sdk.rpc import chunks
from holdfast.sdk.rpc.chunks import (
    ABORT,
    CREDIT,
    CREDIT_EVERY,
    CREDIT_STOP,
    END,
    EPOCH,
    RESTART,
    SEQ,
    STREAM,
    Chunk,
    confirm_chunk,
    credit_guid,
    epoch_of,
    restart_guid,
)
from holdfast.sdk.types import Message


class Verdict(enum.Enum):
    """What a reader does with a chunk delivered to it (``Incoming.offer``)."""

    NEXT = "next"
    """Its turn: read it now."""
    HOLD = "hold"
    """Early: kept until its turn (not confirmed yet, so within the window)."""
    DROP = "drop"
    """Read before (a redelivery), of an earlier round, or not a chunk: confirm it and
    skip it."""
    LATER = "later"
    """Of a later round: a newer reader has the stream (its request went to another
    worker). Left unconfirmed, for that reader; this one gives up."""


class Incoming:
    """The reading side of one stream: puts the delivered chunks back in order, skips
    redeliveries by sequence number, and holds the bytes not read yet. After a
    reconnect the broker redelivers what was not confirmed (a CONFIRM lost with the
    link included), so a chunk may come twice and out of order: neither a gap nor a
    repeat reaches the reader. ``credit`` and ``last_credit`` give the credits the
    front-end posts on the stream's credit queue. ``epoch``: the round to read, the
    request's delivery count less one (``restart`` gives the credit asking for it)."""

    def __init__(self, request_guid: uuid.UUID, name: str, epoch: int = 0) -> None:
        self.name = name
        self.done = False
        """True once the stream ended, failed or was closed."""
        self.epoch = epoch
        """The round this reader reads: 0 for a request's first delivery."""
        self._guid = request_guid
        self._asked = epoch == 0
        self._next = 0
        self._early: dict[int, Message] = {}
        self._data = b""  # the current chunk's bytes, read up to _pos
        self._pos = 0
        self._read_through = -1
        self._credited = -1
        self._finished = False  # the sender's end or failure was read: it sends no more
        self._stop_sent = False

    @property
    def buffered(self) -> bool:
        """True while bytes of the current chunk are unread."""
        return self._pos < len(self._data)

    def read_buffered(self, size: int) -> bytes:
        """Up to ``size`` of the bytes not read yet (``b""`` when none)."""
        data = self._data[self._pos : self._pos + size]
        self._pos += len(data)
        return data

    def line_length(self, size: int) -> int:
        """How many of the bytes not read yet to take for a line: through the first
        ``b"\\n"``, else all of them; at most ``size`` (no bound when negative)."""
        end = len(self._data) if size < 0 else min(len(self._data), self._pos + size)
        newline = self._data.find(b"\n", self._pos, end)
        return (end if newline < 0 else newline + 1) - self._pos

    def ready(self) -> Message | None:
        """The held chunk whose turn it is, if it came early (its turn is then taken)."""
        message = self._early.pop(self._next, None)
        if message is not None:
            self._next += 1
        return message

    def restart(self) -> Chunk | None:
        """The credit asking the sender for this reader's round, to post before
        reading (once; None in round 0, which the sender sends unasked)."""
        if self._asked:
            return None
        self._asked = True
        properties = {STREAM: self.name, CREDIT: "-1", EPOCH: str(self.epoch), RESTART: "1"}
        return Chunk(b"", _expiring(properties), restart_guid(self._guid, self.name, self.epoch))

    def offer(self, message: Message) -> Verdict:
        """Sort a delivered chunk: ``NEXT`` takes its turn."""
        epoch = epoch_of(message.properties)
        if epoch > self.epoch:
            return Verdict.LATER
        try:
            seq = int(message.properties.get(SEQ, ""))
        except ValueError:
            return Verdict.DROP
        if epoch != self.epoch:
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
        turn it is comes back, to be ``accept``ed. ``StreamError`` for a chunk of a
        later round (left unconfirmed: the stream is another reader's now)."""
        verdict = self.offer(message)
        if verdict is Verdict.DROP:
            confirm_chunk(message)
        elif verdict is Verdict.LATER:
            self.close()
            raise StreamError(
                f"stream {self.name}: its request went to another worker, which reads it now"
            )
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
        self._data, self._pos = bytes(message.payload), 0

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
        if self.epoch:
            properties[EPOCH] = str(self.epoch)
        guid = credit_guid(self._guid, self.name, seq, stop, self.epoch)
        return Chunk(b"", _expiring(properties), guid)

    def stalled(self, waited: float) -> StreamError:
        """The error of a stream that brought no chunk for ``waited`` seconds."""
        self.done = True
        return StreamError(f"stream {self.name}: no chunk for {waited:.1f} s")

    def close(self) -> None:
        """Stop: whatever is held or buffered is dropped (a held chunk is confirmed, so
        the broker does not keep it for a reader that will not come)."""
        self.done = True
        for message in self._early.values():
            confirm_chunk(message)
        self._early.clear()
        self._data, self._pos = b"", 0


def _expiring(properties: dict[str, str]) -> dict[str, str]:
    """A credit's properties with its pickup TTL: unread by then, it reaches nobody
    (``chunks.CREDIT_TTL``), and would keep its queue in the broker for good."""
    properties[PICKUP_TTL] = str(round(chunks.CREDIT_TTL * 1000))
    return properties


__all__ = ["Incoming", "Verdict"]

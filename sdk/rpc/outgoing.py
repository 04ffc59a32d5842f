"""The sending side of one data stream, without I/O: its chunks in order, the broker's
verdicts on them, the reader's credits and, for a request's stream, the rounds a new
reader asks for (``holdfast.sdk.rpc.chunks``, "Rounds").

Both front-ends (``holdfast.sdk.rpc.streams``, ``holdfast.sdk.aio.streams``) drive an
``Outgoing`` the same way: wait until ``may_send`` (or ``restart_wanted``), take the
next data from ``replayed()`` or else the source, post what ``data``/``failed`` give,
keeping at most ``WINDOW`` chunks without their ACK (``on_ack``); stop quietly once
``reader_stopped``. When ``restart_wanted``, ``restart`` begins the new round: the
front-end has rewound a seekable source first, or the round comes from the copy this
side kept of the stream's first ``CREDIT_WINDOW`` chunks.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from holdfast.sdk.errors import StreamError
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.chunks import (
    ABORT,
    CREDIT,
    CREDIT_EVERY,
    CREDIT_STOP,
    CREDIT_WINDOW,
    END,
    EPOCH,
    RESTART,
    SEQ,
    STREAM,
    Chunk,
    chunk_guid,
    epoch_of,
)
from holdfast.sdk.types import Ack, AckStatus


class Outgoing:
    """The sending side of one stream (see the module docstring). ``keep``: keep a copy
    of the data of the stream's first ``CREDIT_WINDOW`` chunks, so that a new round can
    be sent from it when the source cannot be rewound (a request's stream read from an
    async iterable or a pipe); a copy costs at most 4 MiB and is dropped as soon as
    the stream passes it."""

    def __init__(
        self,
        request_guid: uuid.UUID,
        name: str,
        credit_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        keep: bool = False,
    ) -> None:
        self.name = name
        self._guid = request_guid
        self._seq = 0
        self._refused: str | None = None
        self._read_through = -1
        self._credit_timeout = credit_timeout
        self._clock = clock
        self._credited_at = clock()
        self._asked = 0
        self._kept: list[bytes] | None = [] if keep else None
        self._replay: deque[bytes] = deque()
        self.epoch = 0
        """The round being sent."""
        self.reader_stopped = False
        """True once the reader said it stopped before the end: send nothing more."""

    @property
    def may_send(self) -> bool:
        """True when the next chunk is within ``CREDIT_WINDOW`` of what the reader has
        read (or the reader stopped, which ends the wait too)."""
        return self.reader_stopped or self._seq - self._read_through <= CREDIT_WINDOW

    @property
    def credits_in(self) -> bool:
        """True, once the round's end is sent, when the reader's last credit came (or
        it stopped): a reader credits every ``CREDIT_EVERY`` chunks before the end and
        never after, so none comes any more. Its last one often comes after the end
        was sent; a credit queue closed before it left it there for good, and one
        delivered just as it closed went back to the queue counted delivered, which
        no pickup TTL expires."""
        end = self._seq - 1
        return self.reader_stopped or self._read_through >= end // CREDIT_EVERY * CREDIT_EVERY - 1

    @property
    def restart_wanted(self) -> bool:
        """True when a new reader asked for a round after the one being sent."""
        return self._asked > self.epoch

    def on_credit(self, properties: Mapping[str, str]) -> None:
        """Take a credit message's properties in. Credits may come twice or out of
        order (redelivered after a reconnect): the highest counts. A credit of another
        round than the one being sent counts for nothing (a lost reader's late one),
        and a restart asks for its round."""
        epoch = epoch_of(properties)
        if RESTART in properties:
            self._asked = max(self._asked, epoch)
            return
        if epoch != self.epoch:
            return
        try:
            seq = int(properties.get(CREDIT, ""))
        except ValueError:
            return
        if seq > self._read_through:
            self._read_through = seq
            self._credited_at = self._clock()
        if CREDIT_STOP in properties:
            self.reader_stopped = True

    def restart(self, rewound: bool) -> StreamError | None:
        """Begin the round a new reader asked for, at chunk 0. ``rewound``: the
        front-end moved the source back to where the stream began; otherwise the round
        is sent from the kept copy (``replayed``) and then the source, from where it
        is. The ``StreamError`` to fail with when neither can give the stream again
        (the front-end posts ``failed(error)``, which reaches the new reader in its
        round); None once the round has begun."""
        self.epoch = self._asked
        self._seq = 0
        self._read_through = -1
        self._credited_at = self._clock()
        self.reader_stopped = False
        self._replay.clear()
        if rewound:
            if self._kept is not None:
                self._kept = []
            return None
        if self._kept is None:
            return StreamError(
                f"stream {self.name}: its request went to another worker, whose reader "
                "needs it from its start, and its source cannot be read again (pass a "
                f"seekable file, or a stream of at most {CREDIT_WINDOW} chunks)"
            )
        self._replay.extend(self._kept)
        return None

    def replayed(self) -> bytes | None:
        """The data of the next chunk of a round sent from the kept copy; None when the
        source is to be read."""
        return self._replay.popleft() if self._replay else None

    def data(self, data: bytes) -> Chunk:
        """The next chunk, carrying ``data`` (at most ``CHUNK_SIZE`` bytes); ``b""``
        gives the end of the stream."""
        data = bytes(data)
        kept = self._kept
        if kept is not None and self._seq == len(kept):  # read from the source just now
            if len(kept) < CREDIT_WINDOW or not data:  # the end fits in any copy
                kept.append(data)
            else:
                self._kept = None  # past the copy: only a rewind can start a round
        return self._next(data, {} if data else {END: "1"})

    def failed(self, error: BaseException) -> tuple[Chunk, StreamError]:
        """The chunk telling the reader that reading the source raised ``error``, and
        the sender's own ``StreamError``."""
        text = wire.error_text(error, 500)  # escaped: an unencodable one lost the ABORT
        chunk = self._next(text.encode(), {ABORT: type(error).__name__[:64]})
        if isinstance(error, StreamError):
            return chunk, error
        return chunk, StreamError(f"stream {self.name}: reading it failed: {text}")

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
        if self.epoch:
            properties[EPOCH] = str(self.epoch)
        return Chunk(payload, properties, chunk_guid(self._guid, self.name, seq, self.epoch))


@runtime_checkable
class _Seekable(Protocol):
    def seekable(self) -> bool: ...
    def tell(self) -> int: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...


def rewind_point(source: object) -> int | None:
    """Where a seekable binary file-like ``source`` is now: a new round starts there
    again (``rewind``). None for a source that cannot seek."""
    try:
        if isinstance(source, _Seekable) and source.seekable():
            return int(source.tell())
    except Exception:  # a file-like object that says it seeks and cannot
        return None
    return None


def rewind(source: object, start: int) -> bool:
    """Move ``source`` (for which ``rewind_point`` gave ``start``) back there; False if
    that failed (the round then cannot begin)."""
    try:
        if isinstance(source, _Seekable):
            source.seek(start)
            return True
    except Exception:
        return False
    return False


__all__ = ["Outgoing", "rewind", "rewind_point"]

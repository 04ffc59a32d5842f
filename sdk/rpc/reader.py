"""The threaded reader of one request/reply data stream (``holdfast.sdk.rpc.streams``):
it opens the stream's queue when first read, takes the chunks in order through
``Incoming``, gives the sender credit and, stopped early, settles what it was given."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import HoldfastError, StreamError, StreamTakenError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc.chunks import (
    CANCEL_POLL,
    CHUNK_SIZE,
    CREDIT_CLOSE_WAIT,
    DRAIN_IDLE,
    STALL_TIMEOUT,
    WINDOW,
    Chunk,
    confirm_chunk,
    credit_uri,
    settle_unread,
    stream_uri,
)
from holdfast.sdk.rpc.incoming import Incoming
from holdfast.sdk.types import Message

if TYPE_CHECKING:
    from holdfast.sdk.queue import Queue
    from holdfast.sdk.session import Session


class StreamReader:
    """A request's incoming stream, as ``request.streams[name]``, or a reply's: a
    binary file-like object, read-only and not seekable (``read(n)``, ``readinto``,
    iteration over chunks, ``with``), so ``shutil.copyfileobj``,
    ``hashlib.file_digest`` and ``io.BufferedReader`` take it. Thread-confined: one
    reader thread."""

    def __init__(
        self,
        session: Session,
        domain: str,
        request_guid: uuid.UUID,
        name: str,
        stall_timeout: float = STALL_TIMEOUT,
        epoch: int = 0,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        """The stream's name."""
        self._cancelled = cancelled  # a request's: its call was cancelled or timed out
        self._session = session
        self._uri = stream_uri(domain, request_guid, name)
        self._credit_uri = credit_uri(domain, request_guid, name)
        self._stall = stall_timeout
        self._queue: Queue | None = None
        self._credits: Queue | None = None
        self._unacked = threading.Semaphore(0)  # released by each credit's ACK
        self._posted = 0
        self._in = Incoming(request_guid, name, epoch)
        self._closed = False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest with -1); ``b""`` at the end. Raises
        ``StreamError`` if the sender failed, the stream stalled, its call was cancelled
        (within ``CANCEL_POLL`` s) or the session closed; ``ValueError`` after
        ``close()``, as a closed file does."""
        self._check_open()
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK_SIZE), b""))
        while not self._in.buffered and not self._in.done:
            self._take()
        return self._in.read_buffered(size)

    def readinto(self, buffer: Any) -> int:
        """Read up to ``len(buffer)`` bytes into ``buffer``; how many (0 at the end)."""
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readline(self, size: int = -1) -> bytes:
        """The bytes up to and including the next ``b"\\n"`` (at most ``size``); ``b""``
        at the end."""
        self._check_open()
        size = -1 if size is None else size
        parts: list[bytes] = []
        while size != 0:
            while not self._in.buffered and not self._in.done:
                self._take()
            part = self._in.read_buffered(self._in.line_length(size))
            if not part:
                break
            parts.append(part)
            size -= len(part) if size > 0 else 0
            if part.endswith(b"\n"):
                break
        return b"".join(parts)

    def readable(self) -> bool:
        """True: a stream is read."""
        return True

    def writable(self) -> bool:
        """False: a stream is only read here."""
        return False

    def seekable(self) -> bool:
        """False: a stream is read once, in order."""
        return False

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (the end of the stream is not a close: a
        read there gives ``b""``, as a file at its end does)."""
        return self._closed

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        self._check_open()
        return iter(lambda: self.read(CHUNK_SIZE), b"")

    def _check_open(self) -> None:
        # As io's objects: a read after close() is the caller's bug, not an end of stream.
        if self._closed:
            raise ValueError("I/O operation on closed file")

    def close(self) -> None:
        """Stop reading; drop the chunks not read (``chunks``, "Leftovers"). A reader
        that stops before the end tells the sender to stop."""
        self._closed = True
        self._stop()

    def _stop(self) -> None:
        early = not self._in.done
        self._in.close()
        last = self._in.last_credit()
        # Best effort: without it the sender waits for credit until its call ends.
        with contextlib.suppress(HoldfastError):
            try:
                if last is not None:
                    self._give(last)  # the sender stops first, then the rest is drained
                if early:
                    self._drain()
            finally:
                if self._queue is not None and self._queue.is_open:
                    self._queue.close()
                self._close_credits()

    def _drain(self) -> None:
        """Confirm what was delivered and not read, and what the sender posted before it
        stopped (``DRAIN_IDLE`` after the last)."""
        if self._queue is None:
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = self._session.open_queue(
                self._uri, read=True, options=options, timeout=CREDIT_CLOSE_WAIT
            )
        settle_unread(self._queue.messages(timeout=DRAIN_IDLE), self._in.epoch)

    def _next(self, started: float) -> Message:
        """The next chunk delivered; ``StreamError`` (the reader closed) once none came
        for the stall timeout since ``started``, the call was cancelled or the session
        closed. Waits ``CANCEL_POLL`` at a time, to see a cancel."""
        assert self._queue is not None
        while True:
            if self._cancelled is not None and self._cancelled():
                error = StreamError(f"stream {self.name}: the call was cancelled")
            elif not self._queue.is_open:
                error = StreamError(f"stream {self.name}: the session closed")
            else:
                waited = time.monotonic() - started
                if waited >= self._stall:
                    error = self._in.stalled(waited)
                else:
                    poll = min(CANCEL_POLL, self._stall - waited)
                    got = next(iter(self._queue.messages(timeout=poll)), None)
                    if got is not None:
                        return got
                    continue
            self._stop()
            raise error

    def _give(self, credit: Chunk) -> None:
        if self._credits is None:
            self._credits = self._session.open_queue(self._credit_uri, write=True)
        self._credits.post(
            credit.payload, credit.properties, lambda _: self._unacked.release(), guid=credit.guid
        )
        self._posted += 1

    def _close_credits(self) -> None:
        if self._credits is None or not self._credits.is_open:
            return
        # A credit still unacknowledged when its queue closes while the link is down is
        # lost (UNKNOWN): wait a little for the broker to take the last ones.
        deadline = time.monotonic() + CREDIT_CLOSE_WAIT
        while self._posted and self._unacked.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._posted -= 1
        self._credits.close()

    def _take(self) -> None:
        if self._queue is None:
            if (restart := self._in.restart()) is not None:
                self._give(restart)  # before reading: the sender starts our round now
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = self._session.open_queue(self._uri, read=True, options=options)
        message = self._in.ready()
        started = time.monotonic()
        while message is None:
            got = self._next(started)
            message = self._in.take(got)
            started = time.monotonic()
        confirm_chunk(message)
        try:
            self._in.accept(message)
            credit = self._in.credit()
            if credit is not None:
                self._give(credit)
        finally:
            if self._in.done:
                self._stop()


class TakenReader:
    """A stream of a durable reply fetched again (``fetch_reply``), as
    ``reply.streams[name]``: the first fetch took the stream, so every read raises
    ``StreamTakenError`` at once (a reader there would wait for chunks already read
    and confirmed until its stall timeout)."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The stream's name."""
        self.closed = False
        """True once ``close()`` was called."""

    def read(self, size: int = -1) -> bytes:
        """Raise ``StreamTakenError`` (``ValueError`` once closed)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        raise StreamTakenError(
            f"stream {self.name}: taken by an earlier fetch_reply of this reply "
            "(a reply's streams are read once)"
        )

    def readinto(self, buffer: Any) -> int:
        """As ``read``."""
        self.read()
        return 0  # not reached: read raises

    def readline(self, size: int = -1) -> bytes:
        """As ``read``."""
        return self.read()

    def __iter__(self) -> Iterator[bytes]:
        self.read()
        return iter(())  # not reached: read raises

    def readable(self) -> bool:
        """True, as any reader's (reading raises)."""
        return True

    def seekable(self) -> bool:
        """False."""
        return False

    def close(self) -> None:
        """Mark it closed (nothing to release)."""
        self.closed = True

    def __enter__(self) -> TakenReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = ["StreamReader", "TakenReader"]

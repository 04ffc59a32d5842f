"""Data streams of the asyncio request/reply API, on the event loop.

::

    async def handle(request: Request) -> StreamingReply:
        digest = hashlib.sha256()
        async for chunk in request.streams["upload"]:  # or await ....read(n)
            digest.update(chunk)
        return StreamingReply(digest.hexdigest().encode(), {}, {"report": report_chunks()})

    reply = await session.request(uri, b"", streams={"upload": open(path, "rb")})
    report = await reply.streams["report"].read()

The wire is the threaded API's (``holdfast.sdk.rpc.streams``), through the same
rules (``holdfast.sdk.rpc.chunks``): same queues, chunk GUIDs and properties, so a
threaded caller can stream to an asyncio worker and back. A source is a binary
file-like object, read ``CHUNK_SIZE`` at a time in the loop's default executor so
that a slow disk does not block the loop, or an async iterable of bytes, whose items
are sent as they come (split at ``CHUNK_SIZE``). Each stream is sent by a task of
its call, which waits without blocking the loop for the reader's credit (at most
``CREDIT_WINDOW`` chunks, 4 MiB, beyond the last one the reader has read, so a slow
reader holds the stream to that much in the broker; the credits come on the queue
``hf://<domain>/rpc-credit-<request guid hex>-<name>``, see
``holdfast.sdk.rpc.chunks``) and for the broker's ACKs (at most ``WINDOW`` chunks
unacknowledged), and is cancelled when the call ends (a worker's reply stream gives
up after ``REPLY_CREDIT_TIMEOUT`` without new credit). A reader is an
``AsyncStreamReader``; it gives credit every ``CREDIT_EVERY`` chunks it reads, and
tells the sender to stop when it is closed before the end. A request's stream is sent
again when another worker takes its request over, as on the threaded side
(``holdfast.sdk.rpc.chunks``, "Rounds").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.sdk.aio.sending import AsyncSource, send, start_senders
from holdfast.sdk.errors import HoldfastError, StreamError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc.chunks import (
    ABORT,
    CANCEL_POLL,
    CHUNK_SIZE,
    CREDIT_CLOSE_WAIT,
    DRAIN_IDLE,
    STALL_TIMEOUT,
    WINDOW,
    Chunk,
    confirm_chunk,
    credit_uri,
    parse_names,
    round_of,
    settle_unread,
    stream_uri,
)
from holdfast.sdk.rpc.incoming import Incoming
from holdfast.sdk.rpc.reader import TakenReader
from holdfast.sdk.types import Ack

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.session import Session


class AsyncStreamReader:
    """An incoming stream of the asyncio API, as ``request.streams[name]`` (in a
    coroutine handler of ``holdfast.sdk.aio.Worker``) or ``reply.streams[name]`` (of
    ``await session.request(...)``): ``async for chunk in reader`` and
    ``await reader.read(n)``. Read it from one task at a time."""

    def __init__(
        self,
        session: Session,
        domain: str,
        request_guid: uuid.UUID,
        name: str,
        stall_timeout: float = STALL_TIMEOUT,
        epoch: int = 0,
    ) -> None:
        self.name = name
        """The stream's name."""
        self._session = session
        self._uri = stream_uri(domain, request_guid, name)
        self._credit_uri = credit_uri(domain, request_guid, name)
        self._stall = stall_timeout
        self._queue: Queue | None = None
        self._credits: Queue | None = None
        self._unacked: set[uuid.UUID] = set()
        self._acked = asyncio.Event()
        self._in = Incoming(request_guid, name, epoch)
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` was called (the end of the stream is not a close: a
        read there gives ``b""``)."""
        return self._closed

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest with -1); ``b""`` at the end. Raises
        ``StreamError`` if the sender failed or no chunk came for the stall timeout
        (``STALL_TIMEOUT``, 30 s); ``ValueError`` after ``aclose()``, as a closed file
        does."""
        self._check_open()
        if size is None or size < 0:
            parts = []
            while part := await self.read(CHUNK_SIZE):
                parts.append(part)
            return b"".join(parts)
        while not self._in.buffered and not self._in.done:
            await self._take()
        return self._in.read_buffered(size)

    def __aiter__(self) -> AsyncStreamReader:
        return self

    async def __anext__(self) -> bytes:
        # A closed reader raises (ValueError, from read) rather than end the loop
        # quietly: stopping there would pass a cut stream off as a whole one.
        data = await self.read(CHUNK_SIZE)
        if not data:
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        """Stop reading; drop the chunks not read (``chunks``, "Leftovers"). A reader
        that stops before the end tells the sender to stop."""
        self._closed = True
        await self._stop()

    def _check_open(self) -> None:
        # As io's objects: a read after aclose() is the caller's bug, not an end of stream.
        if self._closed:
            raise ValueError("I/O operation on closed file")

    async def _stop(self) -> None:
        early = not self._in.done
        self._in.close()
        last = self._in.last_credit()
        # Best effort: without it the sender waits for credit until its call ends.
        with contextlib.suppress(HoldfastError):
            try:
                if last is not None:
                    await self._give(last)  # the sender stops first, then the rest is drained
                if early:
                    await self._drain()
            finally:
                if self._queue is not None and self._queue.is_open:
                    with contextlib.suppress(HoldfastError):
                        await self._queue.close(timeout=5)
                await self._close_credits()

    def failure_delivered(self) -> bool:
        """Whether the sender's failure reached this reader and is not read yet (the
        next read raises it)."""
        return self._queue is not None and any(
            ABORT in message.properties for message in self._queue.delivered()
        )

    async def _close_failed(self) -> None:
        """Close after the sender's failure, in a task of its own: a cancel that comes
        meanwhile (its call's, which the failure caused) must not replace the
        ``StreamError`` the reader's task is to see (it did: ``CancelledError``)."""
        closing = asyncio.ensure_future(self.aclose())
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            # The close goes on; what it raises is retrieved, not reported unseen.
            closing.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _drain(self) -> None:
        """As the threaded reader's: confirm what was delivered and not read, and what
        the sender posted before it stopped (``DRAIN_IDLE`` after the last)."""
        if self._queue is None:
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = await self._session.open_queue(
                self._uri, read=True, options=options, timeout=CREDIT_CLOSE_WAIT
            )
        while True:
            try:
                async with asyncio.timeout(DRAIN_IDLE):
                    message = await anext(self._queue)
            except (TimeoutError, StopAsyncIteration):
                return
            settle_unread([message], self._in.epoch)

    async def _give(self, credit: Chunk) -> None:
        if self._credits is None:
            self._credits = await self._session.open_queue(self._credit_uri, write=True)
        self._unacked.add(credit.guid)

        def on_ack(ack: Ack) -> None:
            self._unacked.discard(credit.guid)
            self._acked.set()

        await self._credits.post(credit.payload, credit.properties, on_ack, guid=credit.guid)

    async def _close_credits(self) -> None:
        if self._credits is None or not self._credits.is_open:
            return
        # A credit still unacknowledged when its queue closes while the link is down is
        # lost (UNKNOWN): wait a little for the broker to take the last ones.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CREDIT_CLOSE_WAIT):
                while self._unacked:
                    self._acked.clear()
                    await self._acked.wait()
        await self._credits.close(timeout=5)

    async def _take(self) -> None:
        if self._queue is None:
            if (restart := self._in.restart()) is not None:
                await self._give(restart)  # before reading: the sender starts our round now
            options = QueueOptions(max_unconfirmed_messages=WINDOW)
            self._queue = await self._session.open_queue(self._uri, read=True, options=options)
        message = self._in.ready()
        while message is None:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._stall):
                    got = await anext(self._queue)
            except (TimeoutError, StopAsyncIteration) as ended:
                error = self._in.stalled(time.monotonic() - started)
                if isinstance(ended, StopAsyncIteration):  # the session closed
                    error = StreamError(f"stream {self.name}: the session closed")
                await self._stop()
                raise error from None
            message = self._in.take(got)
        confirm_chunk(message)
        try:
            self._in.accept(message)
        except StreamError:
            await self._close_failed()
            raise
        try:
            credit = self._in.credit()
            if credit is not None:
                await self._give(credit)
        finally:
            if self._in.done:
                await self._stop()


class AsyncTakenReader:
    """The asyncio form of ``holdfast.sdk.rpc.reader.TakenReader``: a stream of a
    durable reply fetched again, taken by the first fetch; ``await read()`` and
    ``async for`` raise ``StreamTakenError`` at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        """The stream's name."""
        self._taken = TakenReader(name)

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` was called."""
        return self._taken.closed

    async def read(self, size: int = -1) -> bytes:
        """Raise ``StreamTakenError`` (``ValueError`` once closed)."""
        return self._taken.read(size)

    def __aiter__(self) -> AsyncTakenReader:
        return self

    async def __anext__(self) -> bytes:
        return self._taken.read()

    async def aclose(self) -> None:
        """Mark it closed (nothing to release)."""
        self._taken.close()


def readers(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    properties: Mapping[str, str],
    delivery_count: int = 1,
) -> dict[str, AsyncStreamReader]:
    """The readers of the streams a request or reply announces (each opens its queue
    when first read); a redelivered request's (``delivery_count`` > 1) ask for them
    from the start."""
    epoch = round_of(delivery_count)
    return {
        name: AsyncStreamReader(session, domain, request_guid, name, epoch=epoch)
        for name in parse_names(properties)
    }


def cancel_handler(
    streams: Mapping[str, Any], task: asyncio.Task[Any], running: Callable[[], bool]
) -> None:
    """Cancel the ``task`` running a handler whose call was cancelled; but if a reader of
    its ``streams`` holds its sender's failure, which the handler reads next as a
    ``StreamError`` (the caller, whose call failed with it, cancels then: the failure
    was posted first), only ``CANCEL_POLL`` later, if it still ``running()`` (it reads
    on elsewhere). Cancelled at once, it saw ``CancelledError`` instead of why."""
    if not any(
        isinstance(reader, AsyncStreamReader) and reader.failure_delivered()
        for reader in streams.values()
    ):
        task.cancel()
        return

    def late() -> None:
        if running():
            task.cancel()

    asyncio.get_running_loop().call_later(CANCEL_POLL, late)


async def close_all(streams: Mapping[str, Any]) -> None:
    """Close every reader of a finished request (its stream queues with them), all at
    once: a reader left unread drains for ``DRAIN_IDLE`` (0.2 s), and one after
    another, a handler that read none of 40 streams held its reply 8 s."""
    readers = [reader for reader in streams.values() if isinstance(reader, AsyncStreamReader)]
    if not readers:  # most requests: no gather (a future) on every call's path
        return
    outcomes = await asyncio.gather(*(r.aclose() for r in readers), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


__all__ = [
    "AsyncSource",
    "AsyncStreamReader",
    "AsyncTakenReader",
    "cancel_handler",
    "close_all",
    "readers",
    "send",
    "start_senders",
]

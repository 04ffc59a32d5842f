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
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import HoldfastError, StreamError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.chunks import (
    CHUNK_SIZE,
    CREDIT_CLOSE_WAIT,
    DRAIN_IDLE,
    STALL_TIMEOUT,
    WINDOW,
    Chunk,
    Readable,
    confirm_chunk,
    credit_uri,
    parse_names,
    round_of,
    settle_unread,
    stream_uri,
)
from holdfast.sdk.rpc.incoming import Incoming
from holdfast.sdk.rpc.outgoing import Outgoing, rewind, rewind_point
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.session import Session

AsyncSource = Readable | AsyncIterable[bytes]
"""What the asyncio API takes as a stream: a binary file-like object (``read(n)``,
run in the loop's default executor) or an async iterable of bytes."""


async def _pieces(source: AsyncSource) -> AsyncGenerator[bytes, None]:
    """The bytes of ``source``, at most ``CHUNK_SIZE`` at a time, none empty."""
    if isinstance(source, AsyncIterable):
        iterator = aiter(source)
        try:
            async for piece in iterator:
                view = memoryview(piece)  # TypeError for an item that is not bytes-like
                for start in range(0, view.nbytes, CHUNK_SIZE):
                    yield bytes(view[start : start + CHUNK_SIZE])
        finally:
            # ``async for`` leaves an async generator open when the send stops early
            # (cancelled while posting): close it now, not whenever the GC gets to it.
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    loop = asyncio.get_running_loop()
    while data := await loop.run_in_executor(None, source.read, CHUNK_SIZE):
        yield bytes(data)


async def send(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    name: str,
    source: AsyncSource,
    credit_timeout: float | None = None,
    resend: bool = False,
) -> None:
    """Post ``source`` as stream ``name`` of ``request_guid``, in chunks, as far as the
    reader's credit allows, keeping at most ``WINDOW`` unacknowledged. Raises
    ``StreamError`` if the source fails, the broker refuses a chunk (after telling
    the reader, when it can) or no credit came for ``credit_timeout`` seconds; returns
    early if the reader stopped. ``resend`` (a request's stream): send the stream
    again in each round a new reader asks for (its request went to another worker;
    ``holdfast.sdk.rpc.chunks``, "Rounds"), until the task is cancelled, even after the
    whole stream or a reader's stop. Cancel the task to stop it."""
    start = rewind_point(source) if resend else None
    out = Outgoing(request_guid, name, credit_timeout, keep=resend and start is None)
    acks = asyncio.Semaphore(WINDOW)
    credited = asyncio.Event()

    def on_credit(message: Message) -> None:
        out.on_credit(message.properties)
        credited.set()
        confirm_chunk(message)

    def on_ack(ack: Ack) -> None:
        out.on_ack(ack)
        acks.release()

    async def post(chunk: Chunk) -> None:
        await acks.acquire()
        await queue.post(chunk.payload, chunk.properties, on_ack, guid=chunk.guid)

    async def wait(ready: Callable[[], bool]) -> None:
        while not ready():
            if not credit_queue.is_open:
                raise out.no_credit()
            if (overdue := out.credit_overdue()) is not None:
                raise overdue
            credited.clear()
            with contextlib.suppress(TimeoutError):
                # Now and then: a closed session sets no event.
                async with asyncio.timeout(1.0):
                    await credited.wait()

    # Read credits from before the first chunk: the reader may give them at once.
    credit_queue = await session.open_queue(
        credit_uri(domain, request_guid, name), read=True, on_message=on_credit
    )
    pieces = _pieces(source)
    try:
        queue = await session.open_queue(stream_uri(domain, request_guid, name), write=True)
        try:
            sent = False  # the round's last chunk is posted
            while True:
                out.check()
                if out.restart_wanted:
                    rewound = start is not None and rewind(source, start)
                    if rewound:
                        await pieces.aclose()
                        pieces = _pieces(source)
                    error = out.restart(rewound)
                    if error is not None:
                        await post(out.failed(error)[0])
                        raise error
                    sent = False
                if sent or out.reader_stopped:
                    if not resend:
                        await wait(lambda: out.credits_in)  # then no credit is left behind
                        break
                    # Sent: a new reader may still ask for it again while the call lives.
                    await wait(lambda: out.restart_wanted)
                    continue
                # Before reading: what the reader is not ready for stays in the source.
                await wait(lambda: out.may_send or out.restart_wanted)
                if out.restart_wanted or out.reader_stopped:
                    continue
                data = out.replayed()
                if data is None:
                    try:
                        data = await anext(pieces, b"")
                    except Exception as error:
                        chunk, failure = out.failed(error)
                        await post(chunk)
                        raise failure from error
                await post(out.data(data))
                if not data:
                    # Hold the queue open until the broker has every chunk: closing it
                    # earlier would report the unacknowledged ones UNKNOWN.
                    for _ in range(WINDOW):
                        await acks.acquire()
                    out.check()
                    for _ in range(WINDOW):
                        acks.release()
                    sent = True
        finally:
            if queue.is_open:
                with contextlib.suppress(HoldfastError):
                    await queue.close(timeout=5)
    finally:
        with contextlib.suppress(Exception):
            await pieces.aclose()  # closes an async generator source too
        if credit_queue.is_open:
            with contextlib.suppress(HoldfastError):
                await credit_queue.close(timeout=5)


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

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest with -1); ``b""`` at the end. Raises
        ``StreamError`` if the sender failed or no chunk came for the stall timeout
        (``STALL_TIMEOUT``, 30 s)."""
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
        data = await self.read(CHUNK_SIZE)
        if not data:
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        """Stop reading; drop the chunks not read (``chunks``, "Leftovers"). A reader
        that stops before the end tells the sender to stop."""
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
                await self.aclose()
                raise error from None
            message = self._in.take(got)
        confirm_chunk(message)
        try:
            self._in.accept(message)
            credit = self._in.credit()
            if credit is not None:
                await self._give(credit)
        finally:
            if self._in.done:
                await self.aclose()


def start_senders(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    streams: Mapping[str, AsyncSource],
    fail: Callable[[StreamError], None],
    credit_timeout: float | None = None,
    resend: bool = False,
) -> list[asyncio.Task[None]]:
    """A task sending each of ``streams``; a stream that cannot complete calls ``fail``
    with its ``StreamError`` (``credit_timeout`` and ``resend``: see ``send``). Cancel
    the tasks when the call is over."""

    async def run(name: str, source: AsyncSource) -> None:
        try:
            await send(session, domain, request_guid, name, source, credit_timeout, resend)
        except StreamError as error:
            fail(error)
        except Exception as error:  # the link or the queue failed under us
            fail(StreamError(f"stream {name}: {wire.error_text(error)}"))

    loop = asyncio.get_running_loop()
    return [
        loop.create_task(run(name, source), name=f"holdfast-stream-{name}")
        for name, source in streams.items()
    ]


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


async def close_all(streams: Mapping[str, Any]) -> None:
    """Close every reader of a finished request (its stream queues with them)."""
    for reader in streams.values():
        if isinstance(reader, AsyncStreamReader):
            await reader.aclose()


__all__ = ["AsyncSource", "AsyncStreamReader", "close_all", "readers", "send", "start_senders"]

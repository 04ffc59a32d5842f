"""The sending side of the asyncio API's data streams: a task a stream, posting its
chunks as the reader's credit and the broker's ACKs allow (``holdfast.sdk.aio.streams``
tells the whole story; the rules are ``holdfast.sdk.rpc.chunks``')."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import TYPE_CHECKING

from holdfast.sdk.errors import HoldfastError, StreamError
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.chunks import (
    CHUNK_SIZE,
    CREDIT_CLOSE_WAIT,
    WINDOW,
    Chunk,
    Readable,
    confirm_chunk,
    credit_uri,
    stream_uri,
)
from holdfast.sdk.rpc.outgoing import Outgoing, rewind, rewind_point
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.session import Session

AsyncSource = Readable | AsyncIterable[bytes]
"""What the asyncio API takes as a stream: a binary file-like object (``read(n)``,
run in the loop's default executor) or an async iterable of bytes."""

Failing = Callable[[StreamError, asyncio.Future[None] | None], None]
"""Told that a stream cannot complete: its ``StreamError`` and, when the sender told
the reader, a future done once the broker has that chunk (``None``: nothing to wait
for). A cancel sent to the worker waits for it, so the reader sees the failure as a
``StreamError`` before its handler is cancelled."""


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
    failing: Failing | None = None,
) -> None:
    """Post ``source`` as stream ``name`` of ``request_guid``, in chunks, as far as the
    reader's credit allows, keeping at most ``WINDOW`` unacknowledged. Raises
    ``StreamError`` if the source fails, the broker refuses a chunk (after telling
    the reader, when it can) or no credit came for ``credit_timeout`` seconds; returns
    early if the reader stopped. ``resend`` (a request's stream): send the stream
    again in each round a new reader asks for (its request went to another worker;
    ``holdfast.sdk.rpc.chunks``, "Rounds"), until the task is cancelled, even after the
    whole stream or a reader's stop. Cancel the task to stop it. ``failing``: as in
    ``holdfast.sdk.rpc.streams.send``, called once the chunk telling the reader is
    posted, with a future done once the broker ACKed that chunk (or at most
    ``CREDIT_CLOSE_WAIT`` later)."""
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

    async def tell(chunk: Chunk, failure: StreamError) -> None:
        if failing is None:
            await post(chunk)
            return
        told: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_told(ack: Ack) -> None:
            on_ack(ack)
            if not told.done():
                told.set_result(None)

        try:
            # No slot of the window to wait for: the call fails now, not once the
            # broker ACKed the chunks before (never, while the link is down).
            await queue.post(chunk.payload, chunk.properties, on_told, guid=chunk.guid)
        except BaseException:
            told.set_result(None)  # nothing to wait for
            raise
        finally:
            # Once the chunk is posted, not before: the call ends with this failure
            # rather than with the reply the reader's failure makes, and its cancel,
            # which waits for ``told``, reaches the worker after the chunk reached
            # the reader (a cancel first gave the handler ``CancelledError``).
            failing(failure, told)
        deadline = asyncio.get_running_loop().time() + CREDIT_CLOSE_WAIT
        try:
            await asyncio.wait([told], timeout=CREDIT_CLOSE_WAIT)
        except asyncio.CancelledError:
            # The failed call cancels this task at once: keep the queue open until the
            # broker has the chunk (closed earlier, the chunk is reported UNKNOWN).
            left = deadline - asyncio.get_running_loop().time()
            await asyncio.wait([told], timeout=max(0.0, left))
            raise
        finally:
            if not told.done():
                told.set_result(None)  # the cancel waits no longer

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
                        await tell(out.failed(error)[0], error)
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
                        await tell(chunk, failure)
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


def start_senders(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    streams: Mapping[str, AsyncSource],
    fail: Failing,
    credit_timeout: float | None = None,
    resend: bool = False,
) -> list[asyncio.Task[None]]:
    """A task sending each of ``streams``; a stream that cannot complete calls ``fail``
    (``Failing``) with its ``StreamError`` (``credit_timeout`` and ``resend``: see
    ``send``). Cancel the tasks when the call is over."""

    async def run(name: str, source: AsyncSource) -> None:
        told: list[StreamError] = []  # the call failed as the reader was told

        def failing(error: StreamError, chunk_in: asyncio.Future[None] | None) -> None:
            told.append(error)
            fail(error, chunk_in)

        try:
            await send(session, domain, request_guid, name, source, credit_timeout, resend, failing)
        except StreamError as error:
            if not told:
                fail(error, None)
        except Exception as error:  # the link or the queue failed under us
            fail(StreamError(f"stream {name}: {wire.error_text(error)}"), None)

    loop = asyncio.get_running_loop()
    return [
        loop.create_task(run(name, source), name=f"holdfast-stream-{name}")
        for name, source in streams.items()
    ]


__all__ = ["AsyncSource", "Failing", "send", "start_senders"]

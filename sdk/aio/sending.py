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
    failing: Callable[[StreamError], None] | None = None,
) -> None:
    """Post ``source`` as stream ``name`` of ``request_guid``, in chunks, as far as the
    reader's credit allows, keeping at most ``WINDOW`` unacknowledged. Raises
    ``StreamError`` if the source fails, the broker refuses a chunk (after telling
    the reader, when it can) or no credit came for ``credit_timeout`` seconds; returns
    early if the reader stopped. ``resend`` (a request's stream): send the stream
    again in each round a new reader asks for (its request went to another worker;
    ``holdfast.sdk.rpc.chunks``, "Rounds"), until the task is cancelled, even after the
    whole stream or a reader's stop. Cancel the task to stop it. ``failing``: as in
    ``holdfast.sdk.rpc.streams.send``."""
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
        if failing is not None:
            failing(failure)
            # The call, failed, cancels this task: the reader is still told why.
            await asyncio.shield(post(chunk))
        else:
            await post(chunk)

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
    fail: Callable[[StreamError], None],
    credit_timeout: float | None = None,
    resend: bool = False,
) -> list[asyncio.Task[None]]:
    """A task sending each of ``streams``; a stream that cannot complete calls ``fail``
    with its ``StreamError`` (``credit_timeout`` and ``resend``: see ``send``). Cancel
    the tasks when the call is over."""

    async def run(name: str, source: AsyncSource) -> None:
        told: list[StreamError] = []  # the call failed before the reader was told

        def failing(error: StreamError) -> None:
            told.append(error)
            fail(error)

        try:
            await send(session, domain, request_guid, name, source, credit_timeout, resend, failing)
        except StreamError as error:
            if not told:
                fail(error)
        except Exception as error:  # the link or the queue failed under us
            fail(StreamError(f"stream {name}: {wire.error_text(error)}"))

    loop = asyncio.get_running_loop()
    return [
        loop.create_task(run(name, source), name=f"holdfast-stream-{name}")
        for name, source in streams.items()
    ]


__all__ = ["AsyncSource", "send", "start_senders"]

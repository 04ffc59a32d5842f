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
skips what it already read, so a stream has neither gaps nor repeats.

Flow control: the sender posts at most ``CREDIT_WINDOW`` chunks (16, 4 MiB) beyond
the last one the reader has read, so a slow reader, or a worker that has not picked
up the request yet, holds the stream to that much in the broker. The reader gives
credit on the queue ``hf://<domain>/rpc-credit-<request guid hex>-<name>``: after
every ``CREDIT_EVERY`` chunks read, a message whose ``x-rpc-credit`` property is the
sequence number of the last chunk read (its GUID derived like a chunk's, so a
retransmit is dropped), and one with ``x-rpc-credit-stop`` when it stops before the
end, which stops the sender quietly. The sender reads that queue from before its
first chunk until the stream or the call ends, takes the highest credit (they may
come twice or out of order after a reconnect) and waits for credit for as long as
its call lives (a worker's reply stream: at most ``REPLY_CREDIT_TIMEOUT`` without new
credit, then ``StreamError``). Besides, it keeps at most ``WINDOW`` chunks not yet
acknowledged by the broker, so its own memory stays bounded whatever the size of the
stream.

A request's stream is sent again, in a new round, when its request went to another
worker whose reader asks for it (``holdfast.sdk.rpc.chunks``, "Rounds"): the caller's
sender stays ready for that until the call ends, and rewinds a seekable source or
sends again from its copy of the stream's first ``CREDIT_WINDOW`` chunks.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import HoldfastError, StreamError
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.chunks import (
    ABORT,
    CHUNK_SIZE,
    CREDIT_EVERY,
    CREDIT_WINDOW,
    END,
    NAMES,
    SEQ,
    STALL_TIMEOUT,
    STREAM,
    WINDOW,
    Chunk,
    Readable,
    check_names,
    chunk_guid,
    confirm_chunk,
    credit_uri,
    parse_names,
    round_of,
    stream_uri,
)
from holdfast.sdk.rpc.outgoing import Outgoing, rewind, rewind_point
from holdfast.sdk.rpc.reader import StreamReader, TakenReader
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session


def send(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    name: str,
    readable: Readable,
    stop: Callable[[], bool],
    credit_timeout: float | None = None,
    resend: bool = False,
    failing: Callable[[StreamError], None] | None = None,
) -> None:
    """Post ``readable`` as stream ``name`` of ``request_guid``, in chunks, as far as
    the reader's credit allows, keeping at most ``WINDOW`` unacknowledged. Raises
    ``StreamError`` if the readable fails, the broker refuses a chunk (after telling
    the reader, when it can) or no credit came for ``credit_timeout`` seconds;
    returns early if the reader stopped. ``resend`` (a request's stream): until
    ``stop()``, send the stream again in each round a new reader asks for (its request
    went to another worker; ``holdfast.sdk.rpc.chunks``, "Rounds"); it then ends only
    at ``stop()``, with the call-ended ``StreamError``, even after the whole stream or a
    reader's stop. ``failing`` gets a failure of this side before the reader is told
    of it, so that the call ends with it rather than with the reply the reader's
    failure makes."""
    start = rewind_point(readable) if resend else None
    out = Outgoing(request_guid, name, credit_timeout, keep=resend and start is None)
    acks = threading.Semaphore(WINDOW)
    credited = threading.Condition()

    def on_credit(message: Message) -> None:
        # Confirmed first: woken, the sender may close the queue, dropping a later CONFIRM.
        confirm_chunk(message)
        with credited:
            out.on_credit(message.properties)
            credited.notify_all()

    def on_ack(ack: Ack) -> None:
        out.on_ack(ack)
        acks.release()

    def take_ack() -> None:
        while not acks.acquire(timeout=0.2):
            if stop():
                raise out.ended()

    def post(chunk: Chunk) -> None:
        take_ack()
        queue.post(chunk.payload, chunk.properties, on_ack, guid=chunk.guid)

    def tell(chunk: Chunk, failure: StreamError) -> None:
        if failing is not None:
            failing(failure)
        post(chunk)

    def wait(ready: Callable[[], bool]) -> None:
        with credited:
            while not credited.wait_for(ready, timeout=0.2):
                if stop():
                    raise out.ended()
                if not credit_queue.is_open:
                    raise out.no_credit()
                if (overdue := out.credit_overdue()) is not None:
                    raise overdue

    # Read credits from before the first chunk: the reader may give them at once.
    credit_queue = session.open_queue(
        credit_uri(domain, request_guid, name), read=True, on_message=on_credit
    )
    try:
        queue = session.open_queue(stream_uri(domain, request_guid, name), write=True)
        try:
            sent = False  # the round's last chunk is posted
            while True:
                out.check()
                if stop():  # each chunk: credit and ACKs may never make it wait
                    raise out.ended()
                if out.restart_wanted:
                    rewound = start is not None and rewind(readable, start)
                    with credited:  # credits come in on the session's dispatcher thread
                        error = out.restart(rewound)
                    if error is not None:
                        tell(out.failed(error)[0], error)
                        raise error
                    sent = False
                if sent or out.reader_stopped:
                    if not resend:
                        wait(lambda: out.credits_in)  # then the credit queue stays empty
                        break
                    # Sent: a new reader may still ask for it again while the call lives.
                    wait(lambda: out.restart_wanted)
                    continue
                # Before reading: what the reader is not ready for stays in the source.
                wait(lambda: out.may_send or out.restart_wanted)
                if out.restart_wanted or out.reader_stopped:
                    continue
                data = out.replayed()
                if data is None:
                    try:
                        # TypeError for a source that gives str or None: the reader is
                        # told at once, as on the asyncio side.
                        data = bytes(memoryview(readable.read(CHUNK_SIZE)))
                    except Exception as error:
                        chunk, failure = out.failed(error)
                        tell(chunk, failure)
                        raise failure from error
                post(out.data(data))
                if not data:
                    # Hold the queue open until the broker has every chunk: closing it
                    # earlier would report the unacknowledged ones UNKNOWN.
                    for _ in range(WINDOW):
                        take_ack()
                    out.check()
                    acks.release(WINDOW)
                    sent = True
        finally:
            queue.close()
    finally:
        if credit_queue.is_open:  # not when the session ended under it
            with contextlib.suppress(HoldfastError):
                credit_queue.close()


def start_senders(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    streams: Mapping[str, Readable],
    done: Callable[[], bool],
    fail: Callable[[StreamError], None],
    credit_timeout: float | None = None,
    resend: bool = False,
) -> None:
    """Send each of ``streams`` on its own daemon thread until ``done()``; a stream
    that cannot complete calls ``fail`` with its ``StreamError`` (``credit_timeout``
    and ``resend``: see ``send``)."""

    def run(name: str, readable: Readable) -> None:
        told: list[StreamError] = []  # the call failed before the reader was told

        def failing(error: StreamError) -> None:
            told.append(error)
            if not done():
                fail(error)

        try:
            send(
                session, domain, request_guid, name, readable, done, credit_timeout, resend, failing
            )
        except StreamError as error:
            if not told and not done():
                fail(error)
        except Exception as error:  # the link or the queue failed under us
            if not done():
                fail(StreamError(f"stream {name}: {wire.error_text(error)}"))

    for name, readable in streams.items():
        thread = threading.Thread(
            target=run, args=(name, readable), name=f"holdfast-stream-{name}", daemon=True
        )
        thread.start()


def readers(
    session: Session,
    domain: str,
    request_guid: uuid.UUID,
    properties: Mapping[str, str],
    delivery_count: int = 1,
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, StreamReader]:
    """The readers of the streams a request announces (each opens its queue lazily);
    a redelivered request's (``delivery_count`` > 1) ask for them from the start. A
    request's readers fail once ``cancelled()`` (``Request.cancelled.is_set``)."""
    epoch = round_of(delivery_count)
    return {
        name: StreamReader(session, domain, request_guid, name, epoch=epoch, cancelled=cancelled)
        for name in parse_names(properties)
    }


CLOSERS = 16
"""Readers of one request closed at a time (``close_all``)."""


def close_all(streams: Mapping[str, Any]) -> None:
    """Close every reader of a finished request (its stream queues with them), up to
    ``CLOSERS`` at a time: a reader left unread drains for ``DRAIN_IDLE`` (0.2 s), and
    one after another, a handler that read none of 40 streams held its reply 8 s."""
    readers = [reader for reader in streams.values() if isinstance(reader, StreamReader)]
    if len(readers) < 2:
        for reader in readers:
            reader.close()
        return
    with ThreadPoolExecutor(min(CLOSERS, len(readers)), "holdfast-stream-close") as pool:
        for done in [pool.submit(reader.close) for reader in readers]:
            done.result()


__all__ = [
    "ABORT",
    "CHUNK_SIZE",
    "CLOSERS",
    "CREDIT_EVERY",
    "CREDIT_WINDOW",
    "END",
    "NAMES",
    "SEQ",
    "STALL_TIMEOUT",
    "STREAM",
    "WINDOW",
    "Readable",
    "StreamReader",
    "TakenReader",
    "check_names",
    "chunk_guid",
    "close_all",
    "credit_uri",
    "parse_names",
    "readers",
    "send",
    "start_senders",
    "stream_uri",
]

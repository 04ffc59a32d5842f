"""A call that fails because one of its streams cannot be sent ends its handler too,
as a timeout or a cancel does: the handler blocked reading another stream of the call
learns at once, not after the reader's 30 s stall, and its worker is free again. The
handler reading the stream that failed sees why (``StreamError``) before the cancel,
and nothing of the failed sender is left to fail unseen."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator

import pytest

from holdfast.sdk import Request, Session, StreamError, Worker, aio
from tests.rpc.support import aio_worker_and_caller
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(120)


class Held:
    """A stream source whose first read blocks until ``release`` (a slow disk)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def read(self, size: int = -1) -> bytes:
        self.released.wait(60)
        return b""


class Broken:
    """A stream source whose first read fails."""

    def read(self, size: int = -1) -> bytes:
        raise OSError("disk gone")


def test_a_stream_that_fails_ends_the_handler_reading_another(broker: BrokerProcess) -> None:
    uri = unique_uri("stream-failed-call")
    seen: list[tuple[BaseException, float]] = []

    def handle(request: Request) -> bytes:
        started = time.monotonic()
        try:
            request.streams["slow"].read()
        except StreamError as error:
            seen.append((error, time.monotonic() - started))
            raise
        return b""

    held = Held()
    try:
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle),
            Session(broker.address, options=FAST) as caller,
        ):
            with pytest.raises(StreamError, match="stream broken: reading it failed"):
                caller.request(uri, b"", streams={"slow": held, "broken": Broken()}, timeout=60)
            wait_until(lambda: bool(seen), 10, "the handler's read to end")
    finally:
        held.released.set()
    error, waited = seen[0]
    assert "cancelled" in str(error) and waited < 10


def test_an_asyncio_stream_that_fails_ends_the_handler_reading_another(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("aio-stream-failed-call")

    async def run() -> None:
        ended: list[BaseException] = []
        released = asyncio.Event()

        async def slow() -> AsyncIterator[bytes]:
            await released.wait()
            yield b"late"

        async def broken() -> AsyncIterator[bytes]:
            raise OSError("disk gone")
            yield b""  # an async generator

        async def handle(request: Request) -> bytes:
            try:
                await request.streams["slow"].read()
            except BaseException as error:  # CancelledError: the call was cancelled
                ended.append(error)
                raise
            return b""

        async with aio_worker_and_caller(broker.address, uri, handle) as caller:
            started = time.monotonic()
            with pytest.raises(StreamError, match="stream broken: reading it failed"):
                await caller.request(
                    uri, b"", streams={"slow": slow(), "broken": broken()}, timeout=60
                )
            while not ended and time.monotonic() - started < 10:
                await asyncio.sleep(0.05)
            released.set()
            assert ended, "the handler still reads 10 s after its call failed"

    asyncio.run(run())


def test_an_async_iterable_source_that_raises_fails_the_handlers_read_first(
    broker: BrokerProcess,
) -> None:
    """6 MiB then ``OSError``, five times (each call went wrong about half the time):
    the handler reading it gets ``StreamError`` (the abort chunk reaches it before the
    call's cancel, which gave ``CancelledError``), and the loop reports no exception
    (the sender's last post outlived its queue: "Task exception was never retrieved",
    ``QueueNotOpenError``)."""
    uri = unique_uri("aio-stream-source-raises")

    async def run() -> None:
        unseen: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unseen.append(context))
        ended: list[BaseException] = []

        async def source() -> AsyncIterator[bytes]:
            for _ in range(6):
                yield b"y" * (1 << 20)
            raise OSError("source failed")

        async def handle(request: Request) -> bytes:
            try:
                async for _ in request.streams["up"]:
                    pass
            except BaseException as error:
                ended.append(error)
                raise
            return b""

        async with aio_worker_and_caller(broker.address, uri, handle) as caller:
            for attempt in range(1, 6):
                with pytest.raises(StreamError, match="reading it failed: source failed"):
                    await caller.request(uri, b"", streams={"up": source()}, timeout=60)
                await wait_until_async(lambda: len(ended) >= attempt, 10, "the handler to end")  # noqa: B023
        gc.collect()  # a task whose exception nobody retrieved reports it when collected
        await asyncio.sleep(0)
        assert not unseen, [str(context.get("message")) for context in unseen]
        assert [type(error) for error in ended] == [StreamError] * 5, ended
        assert all("source failed" in str(error) for error in ended)

    asyncio.run(run())


def test_a_caller_closing_at_once_after_its_stream_failed_cancels_the_handler(
    broker: BrokerProcess,
) -> None:
    """The call fails on the caller's side (a stream it cannot send) before a worker
    picked it up, and the caller closes its session at once: ``close()`` still cancels
    the handler, waiting for the heartbeat that names its worker. The worker ran it
    until it found the caller gone (``caller_grace``, 5 s), and its next caller's call
    waited behind it."""
    uri = unique_uri("aio-stream-failed-close")

    async def run() -> None:
        started: list[float] = []
        ended: list[float] = []

        async def slow() -> AsyncIterator[bytes]:
            await asyncio.Event().wait()  # never
            yield b""

        async def broken() -> AsyncIterator[bytes]:
            raise OSError("disk gone")
            yield b""  # an async generator

        async def handle(request: Request) -> bytes:
            if not request.streams:
                return b"plain"
            started.append(time.monotonic())
            try:
                await request.streams["slow"].read()
            finally:
                ended.append(time.monotonic())
            return b""

        async with aio_worker_and_caller(broker.address, uri, handle) as caller:
            with pytest.raises(StreamError, match="stream broken: reading it failed"):
                await caller.request(
                    uri, b"", streams={"slow": slow(), "broken": broken()}, timeout=60
                )
            await caller.close()
            closed = time.monotonic()
            async with aio.Session(broker.address, options=FAST) as other:
                reply = await other.request(uri, b"", timeout=30)
            answered = time.monotonic() - closed
            assert reply.payload == b"plain"
            assert answered < 2.5, f"the next call waited {answered:.1f} s behind the failed one"
            assert len(started) == len(ended) <= 1

    asyncio.run(run())


def test_a_threaded_caller_closing_at_once_after_its_stream_failed_cancels_the_handler(
    broker: BrokerProcess,
) -> None:
    """The same with the threaded caller and worker."""
    uri = unique_uri("stream-failed-close")
    started: list[float] = []
    ended: list[float] = []

    def handle(request: Request) -> bytes:
        if not request.streams:
            return b"plain"
        started.append(time.monotonic())
        try:
            request.streams["slow"].read()
        finally:
            ended.append(time.monotonic())
        return b""

    held = Held()
    try:
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle),
        ):
            with (
                Session(broker.address, options=FAST) as caller,  # closed at once
                pytest.raises(StreamError, match="stream broken: reading it failed"),
            ):
                caller.request(uri, b"", streams={"slow": held, "broken": Broken()}, timeout=60)
            closed = time.monotonic()
            with Session(broker.address, options=FAST) as other:
                reply = other.request(uri, b"", timeout=30)
            answered = time.monotonic() - closed
    finally:
        held.released.set()
    assert reply.payload == b"plain"
    assert answered < 2.5, f"the next call waited {answered:.1f} s behind the failed one"
    assert len(started) == len(ended) <= 1

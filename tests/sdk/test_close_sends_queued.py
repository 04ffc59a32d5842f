"""close() sends what is queued before it ends the stream, in both drivers.

CONFIRMs issued before ``close()`` are in the engine's outbound queue, not yet taken
by the writer, when ``close()`` begins. The writer must send them and only then
half-close: a writer that ends the stream at once leaves the broker to redeliver
messages the application had confirmed. The transports here hold the writer back by
hand, so the CONFIRMs are certainly still queued when ``close()`` starts; the last
test does the same as an application would, against a broker process over gRPC.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from holdfast.sdk import ConfirmDroppedError, Message, QueueOptions, Session, aio
from holdfast.sdk.testing import Broker
from holdfast.sdk.transports import AsyncMemoryTransport, MemoryTransport
from holdfast.sdk.transports.base import AsyncConnection, SyncConnection
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, drain, unique_uri
from tests.support.waiting import wait_until, wait_until_async

URI = "hf://test/close"
COUNT = 10

pytestmark = pytest.mark.timeout(60)


class GatedTransport:
    """A memory transport whose writer takes the next frame only while ``gate`` is set."""

    def __init__(self, inner: MemoryTransport) -> None:
        self._inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()
        """Set while the writer waits at the closed gate."""

    def connect(self, address: str, outbound: Iterator[bytes]) -> SyncConnection:
        """Open ``address`` with ``outbound`` taken through the gate."""
        return self._inner.connect(address, self._gated(outbound))

    def _gated(self, outbound: Iterator[bytes]) -> Iterator[bytes]:
        while True:
            if not self.gate.is_set():
                self.held.set()
                self.gate.wait(30)
                self.held.clear()
            try:
                frame = next(outbound)
            except StopIteration:
                return
            yield frame


def test_confirms_queued_when_close_begins_reach_the_broker() -> None:
    received: list[Message] = []
    with Broker() as broker:
        with Session(broker.address, transport=broker.transport()) as producer:
            queue = producer.open_queue(URI, write=True)
            for i in range(COUNT):
                queue.post(b"%d" % i)
            assert producer.flush(timeout=10)
        transport = GatedTransport(broker.transport())
        consumer = Session(broker.address, options=FAST, transport=transport)
        try:
            consumer.open_queue(URI, read=True, on_message=received.append)
            wait_until(lambda: len(received) == COUNT, 10, "every delivery")
            wait_until(lambda: broker.unconfirmed(URI) == COUNT, 10, "the broker's count")
            transport.gate.clear()
            # The writer, idle, may already be waiting for a frame: one CONFIRM wakes it
            # and leaves; the rest are queued behind the closed gate.
            received[0].confirm()
            assert transport.held.wait(10), "the writer at the gate"
            for message in received[1:]:
                message.confirm()
            closing = threading.Thread(target=consumer.close)
            closing.start()
            wait_until(lambda: consumer._driver.core.stopping, 10, "close() under way")
            transport.gate.set()
            closing.join(30)
            assert not closing.is_alive()
        finally:
            transport.gate.set()
            consumer.close()
        # Nothing returned to the queue: every CONFIRM was read before the stream ended.
        wait_until(lambda: broker.unconfirmed(URI) == 0, 10, "the session's end")
        assert broker.depth(URI) == 0


class GatedAsyncConnection:
    """A memory connection whose ``send`` waits while its transport's gate is closed."""

    def __init__(self, inner: AsyncConnection, transport: GatedAsyncTransport) -> None:
        self._inner = inner
        self._transport = transport

    async def send(self, frame: bytes) -> None:
        """Send ``frame`` once the gate is open."""
        gate = self._transport.gate
        if not gate.is_set():
            self._transport.held = True
            await asyncio.wait_for(gate.wait(), 30)
            self._transport.held = False
        await self._inner.send(frame)

    async def receive(self) -> bytes | None:
        """The broker's next frame."""
        return await self._inner.receive()

    async def finish(self) -> None:
        """Half-close."""
        await self._inner.finish()

    async def close(self) -> None:
        """Drop the connection."""
        await self._inner.close()


class GatedAsyncTransport:
    """An asyncio memory transport whose writers wait at ``gate`` while it is closed."""

    def __init__(self, inner: AsyncMemoryTransport) -> None:
        self._inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = False
        """True while a writer waits at the closed gate."""

    async def connect(self, address: str) -> AsyncConnection:
        """Open ``address``; its sends go through the gate."""
        return GatedAsyncConnection(await self._inner.connect(address), self)


def test_asyncio_confirms_queued_when_close_begins_reach_the_broker() -> None:
    async def run(broker: Broker) -> None:
        async with aio.Session(broker.address, transport=broker.async_transport()) as producer:
            queue = await producer.open_queue(URI, write=True)
            for i in range(COUNT):
                await queue.post(b"%d" % i)
            assert await producer.flush(10)
        received: list[Message] = []
        transport = GatedAsyncTransport(broker.async_transport())
        consumer = aio.Session(broker.address, options=FAST, transport=transport)
        async with consumer:
            await consumer.open_queue(URI, read=True, on_message=received.append)
            await wait_until_async(lambda: len(received) == COUNT, 10, "every delivery")
            transport.gate.clear()
            # One CONFIRM wakes the idle writer, which waits at the gate with it; the
            # rest are queued behind.
            received[0].confirm()
            await wait_until_async(lambda: transport.held, 10, "the writer at the gate")
            for message in received[1:]:
                message.confirm()
            closing = asyncio.create_task(consumer.close())
            await wait_until_async(
                lambda: consumer._core.driver.core.stopping, 10, "close() under way"
            )
            with pytest.raises(ConfirmDroppedError):
                received[0].confirm()  # too late: the stream may be half-closed
            transport.gate.set()
            await asyncio.wait_for(closing, 30)

    with Broker() as broker:
        asyncio.run(run(broker))
        # Nothing returned to the queue: every CONFIRM was read before the stream ended.
        wait_until(lambda: broker.unconfirmed(URI) == 0, 10, "the session's end")
        assert broker.depth(URI) == 0


def test_asyncio_confirms_right_before_close_are_not_redelivered(broker: BrokerProcess) -> None:
    """An application's last CONFIRMs and then ``close()`` at once, over gRPC: none of
    the confirmed messages comes back (before the half-close, every one did)."""
    uri = unique_uri("aio-close-confirms")
    count = 2000

    async def run() -> None:
        async with aio.Session(broker.address, options=FAST) as producer:
            queue = await producer.open_queue(uri, write=True)
            for i in range(count):
                await queue.post(b"%d" % i)
            assert await producer.flush(30)
        received: list[Message] = []
        async with aio.Session(broker.address, options=FAST) as consumer:
            await consumer.open_queue(
                uri,
                read=True,
                on_message=received.append,
                options=QueueOptions(max_unconfirmed_messages=count),
            )
            await wait_until_async(lambda: len(received) == count, 30, "every delivery")
            for message in received:
                message.confirm()

    asyncio.run(run())
    assert drain(broker.address, uri, 0) == {}


@pytest.mark.timeout(20)
def test_flush_after_close_answers_at_once() -> None:
    """A closed session has nothing pending: ``flush()`` says so at once, with or
    without a timeout (it waited on the stopped dispatcher for good)."""
    with Broker() as broker:
        session = Session(broker.address, options=FAST, transport=broker.transport())
        session.open_queue(unique_uri("flush"), write=True).post(b"x")
        session.close()
        assert session.flush(timeout=5) is True
        answers: list[bool] = []
        flush = threading.Thread(target=lambda: answers.append(session.flush()), daemon=True)
        flush.start()
        flush.join(5)
        assert answers == [True], "flush() without a timeout did not return after close()"

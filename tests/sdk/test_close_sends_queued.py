"""close() sends what is queued before it ends the stream.

CONFIRMs issued before ``close()`` are in the engine's outbound queue, not yet taken
by the writer, when ``close()`` begins. The writer must send them and only then
half-close: a writer that ends the stream at once leaves the broker to redeliver
messages the application had confirmed. The transport here holds the writer back by
hand, so the CONFIRMs are certainly still queued when ``close()`` starts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from holdfast.sdk import Message, Session
from holdfast.sdk.testing import Broker
from holdfast.sdk.transports import MemoryTransport
from holdfast.sdk.transports.base import SyncConnection
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

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
            wait_until(lambda: consumer._driver.stopping, 10, "close() under way")
            transport.gate.set()
            closing.join(30)
            assert not closing.is_alive()
        finally:
            transport.gate.set()
            consumer.close()
        # Nothing returned to the queue: every CONFIRM was read before the stream ended.
        wait_until(lambda: broker.unconfirmed(URI) == 0, 10, "the session's end")
        assert broker.depth(URI) == 0

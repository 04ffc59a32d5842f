"""An in-process Holdfast broker for your own tests: the real broker, no sockets.

::

    from holdfast.sdk import AckStatus, Session
    from holdfast.sdk.testing import Broker

    with Broker() as broker:
        with Session(broker.address, transport=broker.transport()) as session:
            queue = session.open_queue("hf://test/orders", write=True)
            broker.fail_next_puts(1, AckStatus.STORE_ERROR)   # the next PUT is refused
            queue.post(b"refused", on_ack=print)
            broker.drop_connections()                          # the link breaks; it comes back
            queue.post(b"still delivered", on_ack=print)
            assert session.flush(timeout=10)

``Broker`` runs ``holdfast.broker``'s own code (queues, delivery, GUID dedup, the
memory store) on an event loop thread of its own and serves it over
``holdfast.sdk.transports.memory``: what your code sees is what a real broker does,
frame for frame, without ports or processes. ``async_transport()`` serves the
asyncio API (``holdfast.sdk.aio.Session``) the same way. The hooks change what
travels, never the broker's state behind your back:

- ``drop_connections()`` breaks every open connection (the sessions reconnect);
- ``delay(seconds)`` holds every frame to the clients that long (0 to stop);
- ``fail_next_puts(n, status)`` answers the next ``n`` PUTs with ``status`` without
  handing them to the broker, so a refused PUT is really not in the queue (and a
  ``HISTORY_FULL`` is really retried by the SDK).
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any

import grpc

from holdfast.broker.config import BrokerConfig
from holdfast.broker.server import Broker as _RealBroker
from holdfast.broker.store import MemoryStore
from holdfast.proto import pb
from holdfast.proto.columns import Malformed, ack_batch, put_batch, read_puts
from holdfast.sdk.errors import RetryableTransportError
from holdfast.sdk.statuses import wire_status_of
from holdfast.sdk.transports.memory import (
    AsyncMemoryTransport,
    MemoryEndpoint,
    MemoryNetwork,
    MemoryTransport,
)
from holdfast.sdk.types import AckStatus

__all__ = ["Broker"]


class _Faults:
    """What the test asked to change in transit (shared by every connection)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.delay = 0.0
        self.fail_puts = 0
        self.fail_status: pb.Status = pb.STATUS_STORE_ERROR

    def take_failures(self, available: int) -> tuple[int, pb.Status]:
        with self.lock:
            count = min(available, self.fail_puts)
            self.fail_puts -= count
            return count, self.fail_status


class _MemoryContext:
    """What ``holdfast.server.stream.ContractStream`` needs of a grpc.aio servicer
    context, over the server end of an in-memory connection."""

    def __init__(self, endpoint: MemoryEndpoint, faults: _Faults) -> None:
        self._endpoint = endpoint
        self._faults = faults
        self._cancelled = False
        self._details = ""

    def peer(self) -> str:
        return f"memory:{self._endpoint.address}"

    def cancelled(self) -> bool:
        return self._cancelled

    def set_code(self, code: grpc.StatusCode) -> None:
        self._details = self._details or code.name

    def set_details(self, details: str) -> None:
        self._details = details

    async def read(self) -> Any:
        while True:
            try:
                raw = await self._endpoint.receive_async()
            except RetryableTransportError:
                raw = None
            if raw is None:
                self._cancelled = True
                return grpc.aio.EOF
            raw = await self._refuse_puts(raw)
            if raw is not None:
                return raw

    async def write(self, frame: pb.ServerFrame | bytes) -> None:
        delay = self._faults.delay
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            # Bytes: frames the stream serialized already (a batch of them).
            raw = frame if isinstance(frame, bytes) else frame.SerializeToString()
            self._endpoint.send(raw)
        except RetryableTransportError:
            self._cancelled = True  # the client went away; the stream's reader ends it

    async def _refuse_puts(self, raw: bytes) -> bytes | None:
        """Answer the PUTs the test wants refused; return what is left for the broker."""
        if not self._faults.fail_puts:
            return raw
        frame = pb.ClientFrame.FromString(raw)
        kind = frame.WhichOneof("frame")
        inner = list(frame.batch.frames) if kind == "batch" else [frame]
        batches = [each.puts for each in inner if each.WhichOneof("frame") == "puts"]
        if not batches:
            return raw
        left = 0
        for each in inner:
            if each.WhichOneof("frame") != "puts":
                continue
            try:
                puts = read_puts(each.puts)
            except Malformed:
                left += 1  # the broker answers it
                continue
            rows = list(puts.rows())
            count, status = self._faults.take_failures(len(rows))
            if count:
                refused = [(put.queue_id, put.guid, status) for put in rows[:count]]
                await self.write(pb.ServerFrame(acks=ack_batch(refused)))
            rest = rows[count:]
            each.puts.CopyFrom(
                put_batch(
                    [put.queue_id for put in rest],
                    [put.guid for put in rest],
                    [put.payload for put in rest],
                    [put.age_ms for put in rest],
                    [(i, put.properties) for i, put in enumerate(rest) if put.properties],
                )
            )
            left += len(rest)
        if kind == "puts" and not left:
            return None
        return frame.SerializeToString()

    def end(self) -> None:
        """The stream is over: the client sees an end (or the error the broker set)."""
        if self._details:
            self._endpoint.abort(RetryableTransportError(f"INTERNAL: {self._details}"))
        else:
            self._endpoint.close()


class Broker:
    """The real Holdfast broker in this process, reached over an in-memory transport.

    Use it as a context manager (or ``start()`` / ``stop()``). ``dedup_window`` and
    the other keyword arguments are ``holdfast.broker.config.BrokerConfig`` fields;
    the store is always the memory store.
    """

    def __init__(self, *, address: str = "holdfast-test:7700", **config: Any) -> None:
        self.address = address
        """The address to give ``Session`` (with ``transport=broker.transport()``)."""
        self.network = MemoryNetwork()
        self._config = BrokerConfig(listen="127.0.0.1:0", store="memory", **config)
        self._faults = _Faults()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="holdfast-test-broker", daemon=True
        )
        self._broker: _RealBroker | None = None
        self._contexts: set[_MemoryContext] = set()

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the broker's loop thread and accept connections on ``address``."""
        self._thread.start()
        self._call(self._open())
        self.network.listen(self.address, self._accept)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, end every session, stop the broker and its thread."""
        self.network.stop_listening(self.address)
        if self._broker is not None:
            self._call(self._broker.stop(grace=1.0), timeout)
            self._broker = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------------ transports

    def transport(self) -> MemoryTransport:
        """A transport for ``holdfast.sdk.Session(broker.address, transport=...)``."""
        return MemoryTransport(self.network)

    def async_transport(self) -> AsyncMemoryTransport:
        """A transport for ``holdfast.sdk.aio.Session(broker.address, transport=...)``."""
        return AsyncMemoryTransport(self.network)

    # ------------------------------------------------------------------ hooks

    def drop_connections(self) -> int:
        """Break every open connection, as a network fault would; return how many.
        Sessions see ``ConnectionLost`` and reconnect by themselves."""
        contexts = list(self._contexts)
        for context in contexts:
            context._endpoint.abort(RetryableTransportError("UNAVAILABLE: dropped by the test"))
        return len(contexts)

    def delay(self, seconds: float) -> None:
        """Hold every frame to the clients ``seconds`` before it leaves (0: no delay)."""
        if seconds < 0:
            raise ValueError(f"a delay is >= 0 seconds, not {seconds}")
        self._faults.delay = seconds

    def fail_next_puts(self, count: int, status: AckStatus | pb.Status) -> None:
        """Answer the next ``count`` PUTs with ``status`` (an ``AckStatus`` or a wire
        status) instead of handing them to the broker."""
        if count < 0:
            raise ValueError(f"a count is >= 0, not {count}")
        wire = wire_status_of(status) if isinstance(status, AckStatus) else status
        with self._faults.lock:
            self._faults.fail_puts = count
            self._faults.fail_status = wire

    # ------------------------------------------------------------------ inspection

    @property
    def sessions(self) -> int:
        """How many sessions are connected now."""
        return len(self._contexts)

    def depth(self, uri: str) -> int:
        """How many messages of ``uri`` wait for delivery (not counting unconfirmed ones)."""

        async def read() -> int:
            assert self._broker is not None
            queue = self._broker.queues.get(uri)
            return 0 if queue is None else len(queue.ready)

        depth: int = self._call(read())
        return depth

    def unconfirmed(self, uri: str) -> int:
        """How many messages of ``uri`` are delivered and not yet confirmed."""

        async def read() -> int:
            assert self._broker is not None
            queue = self._broker.queues.get(uri)
            return 0 if queue is None else sum(len(c.unconfirmed) for c in queue.consumers)

        count: int = self._call(read())
        return count

    # ------------------------------------------------------------------ on the loop

    async def _open(self) -> None:
        broker = _RealBroker(self._config, store=MemoryStore())
        broker.recover()
        self._broker = broker

    def _accept(self, endpoint: MemoryEndpoint) -> None:
        self._loop.call_soon_threadsafe(
            lambda: self._loop.create_task(self._serve(endpoint), name="test session")
        )

    async def _serve(self, endpoint: MemoryEndpoint) -> None:
        context = _MemoryContext(endpoint, self._faults)
        self._contexts.add(context)
        try:
            if self._broker is not None:
                await self._broker.serve_stream(context)
        finally:
            self._contexts.discard(context)
            context.end()

    def _call(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

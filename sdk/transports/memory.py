"""An in-process transport: connections are pairs of queues, no sockets, no gRPC.

``MemoryNetwork`` is the switchboard: a test (or an in-process broker) listens
on an address and is handed the server end of every connection made to it;
``MemoryTransport`` (threads) and ``AsyncMemoryTransport`` (asyncio) connect a
session driver to it. Both ends are ``MemoryEndpoint``s and are safe to use from
any thread and any event loop, so a threaded session can talk to an asyncio
server and the other way round.

Frames are raw bytes, exactly as on gRPC, so the driver parses what the server
end sends just as it would off the network.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator

from holdfast.sdk.errors import RetryableTransportError, TransportError


class _Inbox:
    """One direction of a connection: frames in order, then an end or an error."""

    def __init__(self) -> None:
        self._frames: deque[bytes] = deque()
        self._ended = False
        self._error: TransportError | None = None
        self._changed = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, frame: bytes) -> None:
        with self._changed:
            if self._ended:
                raise RetryableTransportError("the connection is closed")
            self._frames.append(frame)
            self._wake()

    def end(self, error: TransportError | None = None) -> None:
        with self._changed:
            if self._ended:
                return
            self._ended = True
            self._error = error
            self._wake()

    def get(self, timeout: float | None = None) -> bytes | None:
        with self._changed:
            if not self._changed.wait_for(lambda: self._frames or self._ended, timeout):
                raise TimeoutError(f"no frame within {timeout} s")
            return self._take()

    async def get_async(self) -> bytes | None:
        loop = asyncio.get_running_loop()
        while True:
            with self._changed:
                if self._frames or self._ended:
                    return self._take()
                future: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, future))
            await future

    def _take(self) -> bytes | None:
        """The next frame, None at a clean end; raises the error of an aborted end (lock held)."""
        if self._frames:
            return self._frames.popleft()
        if self._error is not None:
            raise self._error
        return None

    def _wake(self) -> None:
        self._changed.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class MemoryEndpoint:
    """One end of an in-memory connection (the client's or the server's)."""

    def __init__(self, address: str, inbox: _Inbox, outbox: _Inbox) -> None:
        self.address = address
        """The address the client connected to."""
        self._inbox = inbox
        self._outbox = outbox

    def send(self, frame: bytes) -> None:
        """Queue one frame for the other end; ``RetryableTransportError`` once closed."""
        self._outbox.put(frame)

    def receive(self, timeout: float | None = None) -> bytes | None:
        """The other end's next frame, or None once it has finished sending.

        Raises the ``TransportError`` the other end aborted with, and
        ``TimeoutError`` when nothing came within ``timeout`` seconds.
        """
        return self._inbox.get(timeout)

    async def receive_async(self) -> bytes | None:
        """``receive()`` for asyncio code (any event loop)."""
        return await self._inbox.get_async()

    def finish(self) -> None:
        """Stop sending (a half-close): the other end receives None after what was sent."""
        self._outbox.end()

    def close(self) -> None:
        """Finish sending and stop receiving; the other end sees a clean end."""
        self._outbox.end()
        self._inbox.end()

    def abort(self, error: TransportError) -> None:
        """Drop the connection: the other end's ``receive`` raises ``error``."""
        self._outbox.end(error)
        self._inbox.end()


def _pair(address: str) -> tuple[MemoryEndpoint, MemoryEndpoint]:
    """(client end, server end) of a new connection."""
    to_server, to_client = _Inbox(), _Inbox()
    return (
        MemoryEndpoint(address, to_client, to_server),
        MemoryEndpoint(address, to_server, to_client),
    )


Acceptor = Callable[[MemoryEndpoint], None]
"""Called with the server end of each new connection; must not block (start a thread or task)."""


class MemoryNetwork:
    """Addresses that in-process servers listen on."""

    def __init__(self) -> None:
        self._listeners: dict[str, Acceptor] = {}
        self._lock = threading.Lock()

    def listen(self, address: str, accept: Acceptor) -> None:
        """Hand the server end of every connection to ``address`` to ``accept``."""
        with self._lock:
            self._listeners[address] = accept

    def stop_listening(self, address: str) -> None:
        """Refuse new connections to ``address`` (open ones are left alone)."""
        with self._lock:
            self._listeners.pop(address, None)

    def open(self, address: str) -> MemoryEndpoint:
        """Connect to ``address``: the client end, or ``RetryableTransportError``."""
        with self._lock:
            accept = self._listeners.get(address)
        if accept is None:
            raise RetryableTransportError(f"UNAVAILABLE: nothing listens on {address}")
        client, server = _pair(address)
        accept(server)
        return client


class MemorySyncConnection:
    """A client end for the threaded driver; a thread moves ``outbound`` into it."""

    def __init__(self, endpoint: MemoryEndpoint, outbound: Iterator[bytes]) -> None:
        self._endpoint = endpoint
        self._outbound = outbound
        self._sender = threading.Thread(
            target=self._send_all, name="holdfast-memory-send", daemon=True
        )
        self._sender.start()

    def _send_all(self) -> None:
        try:
            for frame in self._outbound:
                self._endpoint.send(frame)
        except TransportError:
            return  # closed meanwhile: the reader sees the end
        self._endpoint.finish()

    def __iter__(self) -> Iterator[bytes]:
        """The server's frames until it ends the stream."""
        while (frame := self._endpoint.receive()) is not None:
            yield frame

    def close(self) -> None:
        """Drop the connection (idempotent)."""
        self._endpoint.close()


class MemoryTransport:
    """A ``SyncTransport`` over a ``MemoryNetwork``."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network

    def connect(self, address: str, outbound: Iterator[bytes]) -> MemorySyncConnection:
        """Open a connection to whatever listens on ``address``."""
        return MemorySyncConnection(self.network.open(address), outbound)


class MemoryAsyncConnection:
    """A client end for the asyncio driver."""

    def __init__(self, endpoint: MemoryEndpoint) -> None:
        self._endpoint = endpoint

    async def send(self, frame: bytes) -> None:
        """Queue one frame for the server."""
        self._endpoint.send(frame)

    async def receive(self) -> bytes | None:
        """The server's next frame, or None at the end of its stream."""
        return await self._endpoint.receive_async()

    async def finish(self) -> None:
        """Stop sending (a half-close): the server receives None after what was sent."""
        self._endpoint.finish()

    async def close(self) -> None:
        """Drop the connection (idempotent)."""
        self._endpoint.close()


class AsyncMemoryTransport:
    """An ``AsyncTransport`` over a ``MemoryNetwork``."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network

    async def connect(self, address: str) -> MemoryAsyncConnection:
        """Open a connection to whatever listens on ``address``."""
        return MemoryAsyncConnection(self.network.open(address))

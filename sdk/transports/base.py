"""What the session driver needs from a transport: one bidirectional stream of raw frames.

A transport opens a connection to an address; a connection sends serialized
``ClientFrame``s, receives serialized ``ServerFrame``s (parsing them is the
driver's job, so bytes that do not parse are a protocol error, not a transport
one) and can be closed from any thread or task.

Failures are reported as ``holdfast.sdk.errors.TransportError``:
``RetryableTransportError`` when a new connection can cure them,
``TerminalTransportError`` when none can. An orderly end of the server's stream
is not an error: the receiving side simply ends.

The synchronous flavour is pull-based on the way out: ``connect`` takes an
iterator of frames and the transport pulls from it on a thread of its own, as
gRPC's synchronous streams do, so the writer blocks on the transport's flow
control rather than on a buffer of its own. The asyncio flavour is push-based:
``await connection.send(frame)`` returns once the transport has taken it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class SyncConnection(Protocol):
    """One open connection of a ``SyncTransport``."""

    def __iter__(self) -> Iterator[bytes]:
        """The server's frames, raw, until the stream ends; raises ``TransportError``."""
        ...

    def close(self) -> None:
        """Drop the connection (idempotent, any thread); the iteration then ends or raises."""
        ...


class SyncTransport(Protocol):
    """Opens connections for the threaded driver."""

    def connect(self, address: str, outbound: Iterator[bytes]) -> SyncConnection:
        """Open a stream to ``address`` that sends what ``outbound`` yields, in order;
        the end of ``outbound`` half-closes the stream."""
        ...


class AsyncConnection(Protocol):
    """One open connection of an ``AsyncTransport``."""

    async def send(self, frame: bytes) -> None:
        """Send one frame; returns when the transport has taken it."""
        ...

    async def receive(self) -> bytes | None:
        """The server's next frame, raw, or None at the end of the stream."""
        ...

    async def finish(self) -> None:
        """Stop sending (a half-close): the server reads what was sent, then the end."""
        ...

    async def close(self) -> None:
        """Drop the connection (idempotent)."""
        ...


class AsyncTransport(Protocol):
    """Opens connections for the asyncio driver."""

    async def connect(self, address: str) -> AsyncConnection:
        """Open a stream to ``address``."""
        ...

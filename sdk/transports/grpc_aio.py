"""The asyncio gRPC transport: one ``Session`` stream per connection, raw bytes both ways.

Channel arguments (keepalive, message size) and the sorting of gRPC status
codes come from ``holdfast.sdk.transport``, the only place that reads them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from holdfast.proto import SESSION_METHOD
from holdfast.sdk.credentials import channel_credentials, open_aio_channel, token_metadata
from holdfast.sdk.errors import RetryableTransportError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.transport import channel_options, classify_rpc_error


class GrpcAioConnection:
    """A ``grpc.aio`` channel and the session stream on it."""

    def __init__(
        self,
        address: str,
        options: SessionOptions,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._channel = open_aio_channel(address, credentials, channel_options(options))
        self._plaintext_address = None if credentials is not None else address
        # No (de)serializers: frames travel as bytes and the driver parses them.
        self._call: Any = self._channel.stream_stream(SESSION_METHOD)(
            metadata=token_metadata(options.token)
        )
        self._closed = False

    async def send(self, frame: bytes) -> None:
        """Write one frame; waits on gRPC flow control."""
        try:
            await self._call.write(frame)
        except grpc.RpcError as exc:
            raise classify_rpc_error(exc) from exc
        except asyncio.InvalidStateError as exc:  # the call already ended
            raise RetryableTransportError(f"the stream ended: {exc}") from exc

    async def finish(self) -> None:
        """Half-close the stream: the server reads what was written, then its end."""
        try:
            await self._call.done_writing()
        except grpc.RpcError as exc:
            raise classify_rpc_error(exc) from exc
        except asyncio.InvalidStateError as exc:  # the call already ended
            raise RetryableTransportError(f"the stream ended: {exc}") from exc

    async def receive(self) -> bytes | None:
        """The next frame, or None when the server ended the stream."""
        try:
            frame = await self._call.read()
        except grpc.RpcError as exc:
            raise classify_rpc_error(exc, self._plaintext_address) from exc
        if frame is grpc.aio.EOF:
            return None
        return bytes(frame)

    async def close(self) -> None:
        """Cancel the stream and close the channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._call.cancel()
        await self._channel.close()


class GrpcAioTransport:
    """Connects over ``grpc.aio`` with the channel settings of ``options``."""

    def __init__(self, options: SessionOptions) -> None:
        self._options = options
        # Read once, when the session is made: a bad file fails there, typed.
        self._credentials = channel_credentials(options.tls_ca, options.tls_cert, options.tls_key)

    async def connect(self, address: str) -> GrpcAioConnection:
        """Open a session stream to ``address``."""
        return GrpcAioConnection(address, self._options, self._credentials)

"""The synchronous gRPC transport: one ``Session`` stream per connection, raw bytes both ways.

Channel arguments (keepalive, message size) and the sorting of gRPC status
codes come from ``holdfast.sdk.transport``, the only place that reads them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc

from holdfast.proto import SESSION_METHOD
from holdfast.sdk.credentials import channel_credentials, open_channel, token_metadata
from holdfast.sdk.errors import RetryableTransportError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.transport import channel_options, classify_rpc_error


class GrpcConnection:
    """A gRPC channel and the session stream on it."""

    def __init__(
        self,
        address: str,
        options: SessionOptions,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._channel = open_channel(address, credentials, channel_options(options))
        self._plaintext_address = None if credentials is not None else address
        self._metadata = token_metadata(options.token)
        # No (de)serializers: frames travel as bytes and the driver parses them.
        self._method = self._channel.stream_stream(SESSION_METHOD)
        self._call: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def start(self, outbound: Iterator[bytes]) -> None:
        """Start the stream; gRPC pulls ``outbound`` on a thread of its own."""
        with self._lock:
            if self._closed:
                raise RetryableTransportError("connection closed before it opened")
            self._call = self._method(outbound, metadata=self._metadata)

    def __iter__(self) -> Iterator[bytes]:
        """The server's frames until the stream ends; gRPC failures are sorted."""
        try:
            yield from self._call
        except grpc.RpcError as exc:
            raise classify_rpc_error(exc, self._plaintext_address) from exc

    def close(self) -> None:
        """Cancel the stream and close the channel (idempotent, any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self._channel.close()


class GrpcSyncTransport:
    """Connects over gRPC with the channel settings of ``options``."""

    def __init__(self, options: SessionOptions) -> None:
        self._options = options
        # Read once, when the session is made: a bad file fails there, typed.
        self._credentials = channel_credentials(options.tls_ca, options.tls_cert, options.tls_key)

    def connect(self, address: str, outbound: Iterator[bytes]) -> GrpcConnection:
        """Open a session stream to ``address``."""
        connection = GrpcConnection(address, self._options, self._credentials)
        connection.start(outbound)
        return connection

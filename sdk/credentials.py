"""How a client proves itself to a server: TLS channel credentials and the token.

Used by every gRPC client of the SDK (the session transports, commit marks, the
admin client) so that TLS and tokens work the same everywhere. A file that cannot be
read, or is not PEM, is an ``InvalidArgumentError`` naming the option, raised before
any connection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from holdfast.proto.credentials import token_metadata
from holdfast.sdk.errors import InvalidArgumentError


def _read(path: str, option: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InvalidArgumentError(f"{option} {path}: {error.strerror}") from None
    if b"-----BEGIN" not in data:  # else gRPC fails each handshake, naming no file
        raise InvalidArgumentError(f"{option} {path}: not a PEM file (no -----BEGIN line)")
    return data


def channel_credentials(
    tls_ca: str | None, tls_cert: str | None = None, tls_key: str | None = None
) -> grpc.ChannelCredentials | None:
    """TLS credentials of a channel (None: plaintext)."""
    if tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
        private_key=_read(tls_key, "tls_key") if tls_key else None,
        certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None,
    )


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: list[tuple[str, Any]] | None = None,
) -> grpc.Channel:
    """A blocking gRPC channel to ``address``, with TLS when ``credentials`` are given."""
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


def open_aio_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: list[tuple[str, Any]] | None = None,
) -> grpc.aio.Channel:
    """An asyncio gRPC channel to ``address``, with TLS when ``credentials`` are given."""
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=options)


__all__ = ["channel_credentials", "open_aio_channel", "open_channel", "token_metadata"]

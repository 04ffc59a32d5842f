"""The gRPC link settings: channel options, and the sorting of gRPC status codes.

The gRPC transports (``holdfast.sdk.transports.grpc_sync`` and ``grpc_aio``)
build their channels and sort their failures here: this is the transport
boundary. ``classify_rpc_error`` is the only code in the SDK that looks at gRPC
status codes: everything above it sees
``RetryableTransportError`` (reconnect) or ``TerminalTransportError`` (give up).

Liveness is gRPC keepalive, configured here from ``SessionOptions``: pings every
``keepalive_time`` seconds, even on a stream with no data in flight, and a link
whose ping is not answered within ``keepalive_timeout`` is closed by gRPC, which
ends the stream with ``UNAVAILABLE``.
"""

from __future__ import annotations

from typing import Any

import grpc

from holdfast.proto import NO_BROKER
from holdfast.proto.limits import FRAME_CEILING
from holdfast.proto.tls_failures import PLAINTEXT_TO_TLS, name_failure, speaks_tls
from holdfast.sdk.errors import (
    RetryableTransportError,
    TerminalTransportError,
    TransportError,
    UpstreamUnavailableError,
)
from holdfast.sdk.options import SessionOptions

MAX_MESSAGE_BYTES = FRAME_CEILING
"""Largest frame either side of the link accepts: the channel exists before the broker
announces its limits, so it takes the most any broker's limits may need."""

PROBE_TIMEOUT = 0.5
"""Seconds a diagnosis of a closed plaintext link may spend asking for TLS."""

RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
"""Codes a new connection can cure: the link or the peer went away, or hiccupped."""

TERMINAL_CODES = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""Codes no reconnect can cure: the peer is not a Holdfast broker, or refuses us."""


def classify_rpc_error(
    error: grpc.RpcError, plaintext_address: str | None = None
) -> TransportError:
    """Sort a gRPC failure into retryable or terminal (unknown codes are retryable),
    naming a TLS failure first (``holdfast.proto.tls_failures``). A plaintext link
    (``plaintext_address``) closed during its set-up is checked for a TLS server."""
    # grpc.aio's AioRpcError is no grpc.Call, but has the same two methods; its str()
    # is a multi-line repr that must never reach a user or a log line.
    call = isinstance(error, grpc.Call | grpc.aio.AioRpcError)
    code = error.code() if call else None
    details = (error.details() if call else None) or str(error)
    named = name_failure(details)
    if (
        named is None
        and plaintext_address is not None
        and code is grpc.StatusCode.UNAVAILABLE
        and "Socket closed" in details
        and speaks_tls(plaintext_address, PROBE_TIMEOUT)
    ):
        named = PLAINTEXT_TO_TLS
    text = f"{code.name if code else 'ERROR'}: {details}"
    if code is grpc.StatusCode.UNAVAILABLE and details.startswith(NO_BROKER):
        return UpstreamUnavailableError(details[:2000])
    if named is not None:
        text = f"{named} [{text}]"
    if code in TERMINAL_CODES:
        return TerminalTransportError(text)
    return RetryableTransportError(text)


def channel_options(options: SessionOptions) -> list[tuple[str, Any]]:
    """gRPC channel arguments for a session link."""
    return [
        ("grpc.keepalive_time_ms", int(options.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(options.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        # Keep pinging while the stream is idle, or an idle black hole goes unseen.
        ("grpc.http2.max_pings_without_data", 0),
        # A keepalive that finds a flow-control (BDP) ping in flight waits for that
        # ping's answer, under the ping timeout (1 minute by default), not its own.
        ("grpc.http2.ping_timeout_ms", int(options.keepalive_timeout * 1000)),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # Each attempt gets a channel of its own; sharing subchannels across
        # channels would inherit gRPC's own back-off from a previous failure.
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.enable_retries", 0),
    ]

"""Commit marks on the client side: read and record them with the broker's ``CommitMark`` call.

A commit mark is what a writer application (a Spark job, a streaming query) last
committed on a queue: a version, a digest of what it wrote and a row count. The broker
keeps marks forever, so a writer that replays a version it committed long ago (past
the dedup window) finds the mark and writes nothing again. See
``holdfast.broker.marks`` for the broker's rules and ``Session.commit_mark`` for the
public entry point.

The call is unary and idempotent: this module retries it across the session's
addresses until its deadline; ``holdfast.sdk.statuses`` maps the broker's statuses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from holdfast.proto import COMMIT_MARK_METHOD, pb
from holdfast.sdk.credentials import channel_credentials, open_channel, token_metadata
from holdfast.sdk.errors import RequestTimeoutError, TerminalTransportError, UnsupportedCallError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.statuses import commit_mark_error
from holdfast.sdk.transport import classify_rpc_error

RETRY_DELAY = 0.2
"""Seconds between rounds over the addresses while none answers."""


@dataclass(frozen=True, slots=True)
class CommitMark:
    """The latest version an application committed on a queue."""

    app_id: str
    version: int
    digest: bytes
    rows: int
    committed_at: float
    """Broker wall-clock time (seconds since the epoch) of the recording."""


def call_commit_mark(
    addresses: Sequence[str],
    request: pb.CommitMarkRequest,
    timeout: float,
    options: SessionOptions | None = None,
) -> CommitMark | None:
    """Send ``request`` to the first address that answers, retrying until ``timeout``;
    return the mark the broker holds (None: no mark). Raises ``CommitMarkConflictError``,
    ``InvalidArgumentError``, ``RequestFailedError``, ``RequestTimeoutError``."""
    reply: pb.CommitMarkReply = call_unary(
        addresses, COMMIT_MARK_METHOD, request, pb.CommitMarkReply, timeout, options
    )
    return _mark_of(reply)


class Channels:
    """Channels kept open across calls (a task's many ``Staging`` calls), one per
    address; ``close()`` them when done. Thread-safe."""

    def __init__(self, options: SessionOptions | None = None) -> None:
        options = options or SessionOptions()
        self._credentials = channel_credentials(options.tls_ca, options.tls_cert, options.tls_key)
        self._open: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> grpc.Channel:
        """The channel to ``address``, opened at first use."""
        with self._lock:
            channel = self._open.get(address)
            if channel is None:
                channel = self._open[address] = open_channel(address, self._credentials)
            return channel

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            for channel in self._open.values():
                channel.close()
            self._open.clear()


def call_unary(
    addresses: Sequence[str],
    method_name: str,
    request: Any,
    reply_type: Any,
    timeout: float,
    options: SessionOptions | None = None,
    channels: Channels | None = None,
) -> Any:
    """An idempotent unary call of the Broker service (``CommitMark``, ``Staging``):
    sent to the first address that answers, retried across them until ``timeout``;
    returns the reply. ``channels`` keeps channels open across calls (default: one
    per call). Raises ``RequestTimeoutError``, or ``TerminalTransportError`` on a code
    retrying cannot help (``UNIMPLEMENTED``: the server has no such call)."""
    deadline = time.monotonic() + timeout
    options = options or SessionOptions()
    metadata = token_metadata(options.token)
    own = channels is None
    pool = Channels(options) if channels is None else channels
    try:
        return _call(addresses, method_name, request, reply_type, timeout, deadline, metadata, pool)
    finally:
        if own:
            pool.close()


def _call(
    addresses: Sequence[str],
    method_name: str,
    request: Any,
    reply_type: Any,
    timeout: float,
    deadline: float,
    metadata: Any,
    pool: Channels,
) -> Any:
    last = "no address"
    while True:
        for address in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"{method_name} call for {request.app_id[:100]!r}: no answer within "
                    f"{timeout} s (last: {last})"
                )
            method = pool.get(address).unary_unary(
                method_name,
                request_serializer=type(request).SerializeToString,
                response_deserializer=reply_type.FromString,
            )
            try:
                return method(request, timeout=min(remaining, 10.0), metadata=metadata)
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.Call) else None
                failure = classify_rpc_error(error)
                if code is grpc.StatusCode.UNIMPLEMENTED:
                    raise UnsupportedCallError(
                        f"{method_name} call to {address}: {failure}"
                    ) from error
                if isinstance(failure, TerminalTransportError):
                    raise TerminalTransportError(
                        f"{method_name} call to {address}: {failure}"
                    ) from error
                last = f"{address}: {failure}"
                continue
        time.sleep(min(RETRY_DELAY, max(0.0, deadline - time.monotonic())))


def _mark_of(reply: pb.CommitMarkReply) -> CommitMark | None:
    error = commit_mark_error(reply.status, reply.message)
    if error is not None:
        raise error
    if not reply.found:
        return None
    mark = reply.mark
    return CommitMark(mark.app_id, mark.version, mark.digest, mark.rows, mark.committed_at)

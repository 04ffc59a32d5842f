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

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from holdfast.proto import COMMIT_MARK_METHOD, pb
from holdfast.sdk.credentials import channel_credentials, open_channel, token_metadata
from holdfast.sdk.errors import RequestTimeoutError, TerminalTransportError
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
    deadline = time.monotonic() + timeout
    options = options or SessionOptions()
    credentials = channel_credentials(options.tls_ca, options.tls_cert, options.tls_key)
    metadata = token_metadata(options.token)
    last = "no address"
    while True:
        for address in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"commit mark of {request.app_id[:100]!r}: no answer within {timeout} s "
                    f"(last: {last})"
                )
            with open_channel(address, credentials) as channel:
                method = channel.unary_unary(
                    COMMIT_MARK_METHOD,
                    request_serializer=pb.CommitMarkRequest.SerializeToString,
                    response_deserializer=pb.CommitMarkReply.FromString,
                )
                try:
                    reply: pb.CommitMarkReply = method(
                        request, timeout=min(remaining, 10.0), metadata=metadata
                    )
                except grpc.RpcError as error:
                    failure = classify_rpc_error(error)
                    if isinstance(failure, TerminalTransportError):
                        raise TerminalTransportError(
                            f"commit mark call to {address}: {failure}"
                        ) from error
                    last = f"{address}: {failure}"
                    continue
            return _mark_of(reply)
        time.sleep(min(RETRY_DELAY, max(0.0, deadline - time.monotonic())))


def _mark_of(reply: pb.CommitMarkReply) -> CommitMark | None:
    error = commit_mark_error(reply.status, reply.message)
    if error is not None:
        raise error
    if not reply.found:
        return None
    mark = reply.mark
    return CommitMark(mark.app_id, mark.version, mark.digest, mark.rows, mark.committed_at)

"""The proxy relays ``CommitMark`` calls to its upstream brokers.

Commit marks belong to the broker (they must outlive any proxy), so the proxy keeps
none: it forwards each call to the first upstream that answers, in failover order,
and returns the broker's reply unchanged. The call is idempotent, so trying the next
broker after an unreachable one is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from holdfast.proto import COMMIT_MARK_METHOD, pb
from holdfast.sdk.credentials import channel_credentials, open_aio_channel, token_metadata
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.transport import classify_rpc_error
from holdfast.server.guard import ServerGuard, unary_refusal

log = logging.getLogger(__name__)

FORWARD_TIMEOUT = 10.0
"""Seconds one upstream broker gets to answer a relayed call."""


class MarkRelay:
    """Forwards ``CommitMark`` to the upstream brokers; one aio channel per broker."""

    def __init__(
        self,
        addresses: Sequence[str],
        options: SessionOptions | None = None,
        guard: ServerGuard | None = None,
    ) -> None:
        upstream = options or SessionOptions()
        self._credentials = channel_credentials(
            upstream.tls_ca, upstream.tls_cert, upstream.tls_key
        )
        self._metadata = token_metadata(upstream.token)
        self._guard = guard or ServerGuard()
        self._addresses = list(addresses)
        self._channels: dict[str, Any] = {}

    def _method(self, address: str) -> Any:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_aio_channel(address, self._credentials)
            self._channels[address] = channel
        return channel.unary_unary(
            COMMIT_MARK_METHOD,
            request_serializer=pb.CommitMarkRequest.SerializeToString,
            response_deserializer=pb.CommitMarkReply.FromString,
        )

    async def handle(self, request: pb.CommitMarkRequest, context: Any) -> pb.CommitMarkReply:
        """Serve one call by asking the upstream brokers in turn (with the proxy's own
        token), for a client whose token may write (record) or read the queue's domain."""
        refusal = unary_refusal(self._guard, context, request.queue_uri, request.record)
        if refusal is not None:
            return pb.CommitMarkReply(status=refusal[0], message=refusal[1])
        failures: list[str] = []
        for address in self._addresses:
            try:
                reply: pb.CommitMarkReply = await self._method(address)(
                    request, timeout=FORWARD_TIMEOUT, metadata=self._metadata
                )
            except grpc.RpcError as error:
                failures.append(f"{address}: {classify_rpc_error(error)}")
                continue
            return reply
        log.warning("commit mark call: no upstream broker answered (%s)", "; ".join(failures))
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "no upstream broker answered: " + "; ".join(failures)
        )
        raise AssertionError("context.abort returns only by raising")

    async def close(self) -> None:
        """Close the upstream channels."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

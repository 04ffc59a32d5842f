"""The proxy relays ``CommitMark`` and ``Staging`` calls to its upstream brokers.

Commit marks and staged rows belong to the broker (they must outlive any proxy), so the
proxy keeps none: it forwards each call to the first upstream that answers, in failover order,
and returns the broker's reply unchanged. Both calls are idempotent, so trying the
next broker after an unreachable one is safe. A broker's own refusal (UNIMPLEMENTED:
a broker older than staging) is passed on as it came.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from holdfast.proto import COMMIT_MARK_METHOD, STAGING_METHOD, pb
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

    def _method(self, address: str, name: str, reply_type: Any) -> Any:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_aio_channel(address, self._credentials)
            self._channels[address] = channel
        return channel.unary_unary(
            name,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=reply_type.FromString,
        )

    async def handle(self, request: pb.CommitMarkRequest, context: Any) -> pb.CommitMarkReply:
        """Serve one call by asking the upstream brokers in turn (with the proxy's own
        token), for a client whose token may write (record) or read the queue's domain."""
        refusal = unary_refusal(self._guard, context, request.queue_uri, request.record)
        if refusal is not None:
            return pb.CommitMarkReply(status=refusal[0], message=refusal[1])
        reply: pb.CommitMarkReply = await self._forward(
            COMMIT_MARK_METHOD, pb.CommitMarkReply, request, context
        )
        return reply

    async def handle_staging(self, request: pb.StagingRequest, context: Any) -> pb.StagingReply:
        """Relay one ``Staging`` call, for a client whose token may write the queue's
        domain."""
        refusal = unary_refusal(self._guard, context, request.queue_uri, True)
        if refusal is not None:
            return pb.StagingReply(status=refusal[0], message=refusal[1])
        reply: pb.StagingReply = await self._forward(
            STAGING_METHOD, pb.StagingReply, request, context
        )
        return reply

    async def _forward(self, name: str, reply_type: Any, request: Any, context: Any) -> Any:
        failures: list[str] = []
        for address in self._addresses:
            try:
                return await self._method(address, name, reply_type)(
                    request, timeout=FORWARD_TIMEOUT, metadata=self._metadata
                )
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
                if code is grpc.StatusCode.UNIMPLEMENTED:
                    await context.abort(code, error.details() or "not implemented upstream")
                failures.append(f"{address}: {classify_rpc_error(error)}")
                continue
        log.warning("%s call: no upstream broker answered (%s)", name, "; ".join(failures))
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "no upstream broker answered: " + "; ".join(failures)
        )
        raise AssertionError("context.abort returns only by raising")

    async def close(self) -> None:
        """Close the upstream channels."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

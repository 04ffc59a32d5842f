"""Operating a broker's queues from Python: what the ``holdfast`` command uses.

::

    from holdfast.sdk.admin import AdminClient, QueuePolicy

    with AdminClient("127.0.0.1:7700") as admin:
        admin.set_policy("hf://shop/orders", QueuePolicy(max_deliveries=5,
                         dead_letter="hf://shop/orders.dlq"))
        for queue in admin.queues():
            print(queue.uri, queue.ready, queue.unconfirmed)

The admin service runs on the broker (not the proxy): point it at a broker's
``--listen`` address. Each call is unary; refusals raise typed errors mapped in
``holdfast.sdk.statuses`` (``InvalidArgumentError``, ``QueueNotFoundError``,
``QueueInUseError``, ``RequestFailedError``), and link failures are sorted at the
transport boundary (``RetryableTransportError`` for a broker that cannot be reached,
``TerminalTransportError`` for one that refuses the service).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from holdfast.proto import ADMIN_SERVICE, pb
from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.proto.policy import QueuePolicy, check_policy_uri
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.sdk.credentials import channel_credentials, open_channel, token_metadata
from holdfast.sdk.errors import InvalidArgumentError, TerminalTransportError
from holdfast.sdk.options import MAX_SECONDS
from holdfast.sdk.statuses import admin_error, invalid_error
from holdfast.sdk.transport import classify_rpc_error

DEFAULT_TIMEOUT = 10.0
"""Seconds an admin call may take, connecting included."""


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue as the broker sees it now (``holdfast stats``)."""

    uri: str
    ready: int
    """Messages waiting for delivery, including those waiting out a reject delay."""
    unconfirmed: int
    """Messages delivered and not yet confirmed."""
    bytes: int
    """Payload bytes of all its messages."""
    consumers: int
    handles: int
    """Queue handles open on it, over all sessions."""
    oldest_age: float
    """Seconds the oldest message has waited (0 when empty)."""
    accepted: int
    redelivered: int
    rejected: int
    dead_lettered: int
    """Messages moved to the dead-letter queue or dropped, all reasons."""
    expired: int
    policy: QueuePolicy

    @classmethod
    def from_wire(cls, stats: pb.QueueStats) -> QueueInfo:
        """Read a ``holdfast.v1.QueueStats``."""
        return cls(
            stats.uri,
            stats.ready,
            stats.unconfirmed,
            stats.bytes,
            stats.consumers,
            stats.handles,
            stats.oldest_age_seconds,
            stats.accepted,
            stats.redelivered,
            stats.rejected,
            stats.dead_lettered,
            stats.expired,
            QueuePolicy.from_wire(stats.policy),
        )


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A ready message seen without taking it (``holdfast peek``)."""

    guid: bytes
    payload: bytes
    properties: Mapping[str, str]
    delivery_count: int
    age: float
    """Seconds since the broker accepted it."""


class AdminClient:
    """Calls a broker's admin service at ``address`` (``HOST:PORT``)."""

    def __init__(
        self,
        address: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        # gRPC makes an infinite or huge timeout a deadline already past, and refuses a
        # token it cannot carry only at the first call (INTERNAL): both refused here.
        if not 0 < timeout <= MAX_SECONDS:
            raise InvalidArgumentError(
                f"timeout must be > 0 and at most {MAX_SECONDS:g} seconds, not {timeout!r}"
            )
        self.address = address
        self.timeout = timeout
        # An admin token (--auth-file "admin": true); default $HOLDFAST_TOKEN.
        token = token or os.environ.get("HOLDFAST_TOKEN")
        if token and not sendable_token(token):
            given = "$HOLDFAST_TOKEN" if token == os.environ.get("HOLDFAST_TOKEN") else "token"
            raise InvalidArgumentError(f"{given}: {TOKEN_RULE}")
        self._metadata = token_metadata(token)
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        self._channel = open_channel(address, credentials)
        self._plaintext_address = None if credentials is not None else address

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def queues(self) -> list[QueueInfo]:
        """Every queue the broker holds, sorted by URI."""
        reply = self._call("ListQueues", pb.ListQueuesRequest(), pb.ListQueuesReply)
        return [QueueInfo.from_wire(stats) for stats in reply.queues]

    def stats(self, uri: str) -> QueueInfo:
        """One queue's figures; ``QueueNotFoundError`` if the broker does not hold it."""
        reply = self._call("QueueStats", pb.QueueRequest(uri=_uri(uri)), pb.QueueStatsReply)
        return QueueInfo.from_wire(reply.stats)

    def peek(self, uri: str, count: int = 10, skip: int = 0) -> list[PeekedMessage]:
        """``count`` ready messages (at most 1000) after the first ``skip``, left in the
        queue (page through a queue with ``skip``; pages are read one at a time)."""
        request = pb.PeekRequest(uri=_uri(uri), count=max(1, min(count, 1000)), skip=skip)
        reply = self._call("Peek", request, pb.PeekReply)
        return [
            PeekedMessage(m.guid, m.payload, dict(m.properties), m.delivery_count, m.age_seconds)
            for m in reply.messages
        ]

    def purge(self, uri: str) -> int:
        """Remove the ready messages (consumers keep what they hold); returns how many."""
        reply = self._call("Purge", pb.QueueRequest(uri=_uri(uri)), pb.CountReply)
        return int(reply.count)

    def delete(self, uri: str) -> int:
        """Delete an unused queue with its messages, dedup history and policy; returns
        how many messages went. ``QueueInUseError`` while sessions have it open."""
        reply = self._call("Delete", pb.QueueRequest(uri=_uri(uri)), pb.CountReply)
        return int(reply.count)

    def set_policy(self, uri: str, policy: QueuePolicy) -> QueuePolicy:
        """Replace the policy of a queue or of a template URI (``hf://<domain>/<prefix>*``:
        every queue whose name starts with the prefix and has no policy of its own);
        ``QueuePolicy()`` clears it. Returns the policy as set."""
        request = pb.SetPolicyRequest(uri=_uri(uri, template=True), policy=policy.to_wire())
        reply = self._call("SetPolicy", request, pb.PolicyReply)
        return QueuePolicy.from_wire(reply.policy)

    def policy(self, uri: str) -> QueuePolicy:
        """The policy in force at a queue (its own, or its template's; all ``None``
        when there is none) or at a template URI (``hf://<domain>/<prefix>*``)."""
        request = pb.QueueRequest(uri=_uri(uri, template=True))
        reply = self._call("GetPolicy", request, pb.PolicyReply)
        return QueuePolicy.from_wire(reply.policy)

    def replay_dead_letters(self, uri: str) -> tuple[int, str]:
        """Move every ready message of the dead-letter queue ``uri`` back to its
        ``x-original-uri``, once each; returns how many and the broker's note on
        messages it left in place (empty if none)."""
        reply = self._call("ReplayDeadLetters", pb.QueueRequest(uri=_uri(uri)), pb.CountReply)
        return int(reply.count), reply.message

    def _call(self, method: str, request: Any, reply_type: Any) -> Any:
        call = self._channel.unary_unary(
            f"/{ADMIN_SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply_type.FromString,
        )
        try:
            reply = call(
                request, timeout=self.timeout, wait_for_ready=False, metadata=self._metadata
            )
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            if code is grpc.StatusCode.UNIMPLEMENTED:
                raise TerminalTransportError(
                    f"{self.address} does not serve the admin service (is it a proxy?): "
                    "point --address at a broker"
                ) from None
            raise classify_rpc_error(error, self._plaintext_address) from None
        problem = admin_error(reply.status, reply.message)
        if problem is not None:
            raise problem
        return reply


def _uri(uri: str, template: bool = False) -> str:
    """Check a URI before sending it: bad input fails here, typed, without a call."""
    try:
        check_policy_uri(uri) if template else parse_queue_uri(uri)
    except Invalid as error:
        raise invalid_error(error) from None
    return uri


__all__ = ["AdminClient", "PeekedMessage", "QueueInfo", "QueuePolicy"]

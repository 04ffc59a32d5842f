"""The broker's ``holdfast.v1.Admin`` service: what the ``holdfast`` command asks.

The service checks the caller and the URI and answers; the store's queues do the
work (``AdminBackend``). Each call runs on the broker's event loop like the sessions
do, so it sees and changes the queues atomically between awaits. Changes that must be durable (a
policy, a purge, a delete, a replay) are written to the store and awaited before
the reply says OK: an operator who saw OK can restart the broker and find them.
An admin token acts on the domains it may read (``queues`` lists only those; ``stats``,
``peek``, ``policy show``) or write (``purge``, ``delete``, ``policy set``, also for
the dead-letter and redirect queues a policy names, and ``dlq replay``);
``"*"`` is every domain. Every refusal is a typed status with one line of
explanation (``Invalid``, or ``PERMISSION_DENIED`` for another domain):
``INVALID_ARGUMENT`` for a bad URI or policy, ``NOT_FOUND`` for a queue the broker
does not know, ``QUEUE_IN_USE`` for a delete with open handles, ``STORE_ERROR``
when the store could not record the change.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from holdfast.broker.store import StoredMessage
from holdfast.proto import ADMIN_SERVICE, pb
from holdfast.proto.policy import QueuePolicy, check_policy_uri
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.server.auth import Grant
from holdfast.server.guard import Refusal, ServerGuard, domain_refusal, unary_grant

log = logging.getLogger(__name__)

MAX_PEEK = 1000
"""Most messages one ``Peek`` returns."""

Reply = TypeVar("Reply")


class AdminBackend(Protocol):
    """What the admin service asks of a store's queues (``admin_local.LocalAdmin`` for
    the memory and sqlite stores, ``redis.admin.RedisAdmin`` for Redis). Each method
    raises ``Invalid`` with a typed status for what it refuses."""

    async def list_queues(self) -> list[pb.QueueStats]:
        """Every queue, sorted by URI."""
        ...

    async def stats(self, uri: str) -> pb.QueueStats:
        """One queue's depth, consumers, counters and policy."""
        ...

    async def peek(self, uri: str, count: int, skip: int = 0) -> list[pb.PeekedMessage]:
        """``count`` ready messages after the first ``skip``, in delivery order, left in
        place."""
        ...

    async def purge(self, uri: str) -> int:
        """Remove the ready (and delayed) messages, durably; returns how many."""
        ...

    async def delete(self, uri: str) -> int:
        """Delete an unused queue with its messages and policy; returns how many went."""
        ...

    async def set_policy(self, uri: str, policy: QueuePolicy) -> None:
        """Replace the policy of a queue or template, durably."""
        ...

    async def get_policy(self, uri: str) -> QueuePolicy:
        """The policy in force at a queue or template."""
        ...

    async def replay(self, uri: str, may_write: Callable[[str], bool]) -> tuple[int, list[str]]:
        """Move a dead-letter queue's messages back into the domains ``may_write``
        allows; returns how many and the problems of those left in place."""
        ...


class AdminService:
    """Serves ``holdfast.v1.Admin`` from a store's queues (``AdminBackend``)."""

    def __init__(self, backend: AdminBackend, guard: ServerGuard | None = None) -> None:
        self._backend = backend
        self._guard = guard if guard is not None else ServerGuard()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of every admin method (for ``proto.serve.start_server``)."""
        methods: dict[str, tuple[Method[Any], Any, Any, Needs]] = {
            "ListQueues": (self.list_queues, pb.ListQueuesRequest, pb.ListQueuesReply, _nothing),
            "QueueStats": (self.queue_stats, pb.QueueRequest, pb.QueueStatsReply, _read),
            "Peek": (self.peek, pb.PeekRequest, pb.PeekReply, _read),
            "Purge": (self.purge, pb.QueueRequest, pb.CountReply, _write),
            "Delete": (self.delete, pb.QueueRequest, pb.CountReply, _write),
            "SetPolicy": (self.set_policy, pb.SetPolicyRequest, pb.PolicyReply, _policy_writes),
            "GetPolicy": (self.get_policy, pb.QueueRequest, pb.PolicyReply, _read),
            "ReplayDeadLetters": (self.replay, pb.QueueRequest, pb.CountReply, _write),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                _guarded(method, reply, self._guard, needs),
                request_deserializer=request.FromString,
                response_serializer=reply.SerializeToString,
            )
            for name, (method, request, reply, needs) in methods.items()
        }
        return grpc.method_handlers_generic_handler(ADMIN_SERVICE, handlers)

    async def list_queues(self, request: pb.ListQueuesRequest, grant: Grant) -> pb.ListQueuesReply:
        """Every queue the broker holds now of a domain the caller may read, by URI."""
        queues = [
            queue
            for queue in await self._backend.list_queues()
            if domain_refusal(grant, queue.uri, write=False) is None
        ]
        return pb.ListQueuesReply(status=pb.STATUS_OK, queues=queues)

    async def queue_stats(self, request: pb.QueueRequest, grant: Grant) -> pb.QueueStatsReply:
        """One queue's depth, consumers, counters and policy."""
        parse_queue_uri(request.uri)
        stats = await self._backend.stats(request.uri)
        return pb.QueueStatsReply(status=pb.STATUS_OK, stats=stats)

    async def peek(self, request: pb.PeekRequest, grant: Grant) -> pb.PeekReply:
        """The first ``count`` ready messages, in delivery order, left in place."""
        parse_queue_uri(request.uri)
        count = min(request.count or 10, MAX_PEEK)
        messages = await self._backend.peek(request.uri, count, request.skip)
        return pb.PeekReply(status=pb.STATUS_OK, messages=messages)

    async def purge(self, request: pb.QueueRequest, grant: Grant) -> pb.CountReply:
        """Remove the ready (and delayed) messages; consumers keep their unconfirmed ones."""
        parse_queue_uri(request.uri)
        count = await self._backend.purge(request.uri)
        log.info("admin: purged %d messages of %s", count, request.uri)
        return pb.CountReply(status=pb.STATUS_OK, count=count)

    async def delete(self, request: pb.QueueRequest, grant: Grant) -> pb.CountReply:
        """Delete an unused queue with its messages, history and policy."""
        parse_queue_uri(request.uri)
        count = await self._backend.delete(request.uri)
        log.info("admin: deleted %s with %d messages", request.uri, count)
        return pb.CountReply(status=pb.STATUS_OK, count=count)

    async def set_policy(self, request: pb.SetPolicyRequest, grant: Grant) -> pb.PolicyReply:
        """Replace the policy of a queue (creating it if it does not exist) or of a
        template (``hf://<domain>/<prefix>*``)."""
        check_policy_uri(request.uri)
        policy = QueuePolicy.from_wire(request.policy)
        await self._backend.set_policy(request.uri, policy)
        log.info("admin: policy of %s is now %s", request.uri, policy)
        return pb.PolicyReply(status=pb.STATUS_OK, policy=policy.to_wire())

    async def get_policy(self, request: pb.QueueRequest, grant: Grant) -> pb.PolicyReply:
        """The policy in force at a queue (its own or its template's) or a template."""
        check_policy_uri(request.uri)
        policy = await self._backend.get_policy(request.uri)
        return pb.PolicyReply(status=pb.STATUS_OK, policy=policy.to_wire())

    async def replay(self, request: pb.QueueRequest, grant: Grant) -> pb.CountReply:
        """Move every ready message of a dead-letter queue back to its original queue,
        once each."""
        parse_queue_uri(request.uri)
        # A dead letter goes back only into a domain the replaying token may write.
        count, problems = await self._backend.replay(request.uri, grant.can_write)
        text = ""
        if problems:
            text = f"{len(problems)} messages left in place: " + "; ".join(list(problems)[:5])
        log.info("admin: replayed %d dead letters of %s", count, request.uri)
        return pb.CountReply(status=pb.STATUS_OK, count=count, message=text)


def peeked(message: StoredMessage, now: float) -> pb.PeekedMessage:
    """How ``Peek`` shows a message (``now`` on the clock of its ``accepted_at``)."""
    return pb.PeekedMessage(
        guid=message.guid,
        payload=message.payload,
        properties=message.properties,
        delivery_count=message.delivery_count,
        age_seconds=max(0.0, now - message.accepted_at),
    )


Method = Callable[[Any, Grant], Awaitable[Reply]]
Needs = Callable[[Any], list[tuple[str, bool]]]
"""The queues (or templates) a request acts on, each with whether it writes there."""


def _nothing(request: Any) -> list[tuple[str, bool]]:
    return []


def _read(request: Any) -> list[tuple[str, bool]]:
    return [(request.uri, False)]


def _write(request: Any) -> list[tuple[str, bool]]:
    return [(request.uri, True)]


def _policy_writes(request: pb.SetPolicyRequest) -> list[tuple[str, bool]]:
    # Messages the policy sends elsewhere are writes there, on the setter's behalf.
    policy = request.policy
    targets = (request.uri, policy.dead_letter_uri, policy.redirect_uri)
    return [(uri, True) for uri in targets if uri]


def _guarded(
    method: Method[Reply], reply: type[Any], guard: ServerGuard, needs: Needs
) -> Callable[[Any, Any], Awaitable[Reply]]:
    """Refuse a caller without an admin token (with ``--auth-file``) or acting on a
    domain its token may not read or write (``needs``), and answer ``Invalid`` with its
    typed status in the reply (a bug still fails the call with gRPC's UNKNOWN status,
    which the CLI reports as such)."""

    async def call(request: Any, context: Any) -> Reply:
        grant = unary_grant(guard, context, admin=True)
        if not isinstance(grant, Grant):
            refused: Reply = _refused(reply, grant)
            return refused
        for uri, write in needs(request):
            refusal = domain_refusal(grant, uri, write)
            if refusal is not None:
                denied: Reply = _refused(reply, refusal)
                return denied
        try:
            return await method(request, grant)
        except Invalid as error:
            answer: Reply = reply(status=error.status, message=error.message)
            return answer

    return call


def _refused(reply: type[Any], refusal: Refusal) -> Any:
    return reply(status=refusal[0], message=refusal[1])


__all__ = ["MAX_PEEK", "AdminBackend", "AdminService", "peeked"]

"""The broker's ``holdfast.v1.Admin`` service: what the ``holdfast`` command asks.

Each call runs on the broker's event loop like the sessions do, so it sees and
changes the queues atomically between awaits. Changes that must be durable (a
policy, a purge, a delete, a replay) are written to the store and awaited before
the reply says OK: an operator who saw OK can restart the broker and find them.
Every refusal is a typed status with one line of explanation (``Invalid``):
``INVALID_ARGUMENT`` for a bad URI or policy, ``NOT_FOUND`` for a queue the broker
does not know, ``QUEUE_IN_USE`` for a delete with open handles, ``STORE_ERROR``
when the store could not record the change.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from holdfast.broker.queues import Queue
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.store import Store, StoreBatch
from holdfast.proto import ADMIN_SERVICE, pb
from holdfast.proto.guard import ServerGuard, unary_refusal
from holdfast.proto.policy import QueuePolicy, check_policy_uri
from holdfast.proto.validate import Invalid, parse_queue_uri

log = logging.getLogger(__name__)

MAX_PEEK = 1000
"""Most messages one ``Peek`` returns."""

Reply = TypeVar("Reply")


class AdminService:
    """Serves ``holdfast.v1.Admin`` from a broker's queues and store."""

    def __init__(
        self,
        queues: QueueRegistry,
        store: Store,
        clock: Callable[[], float],
        guard: ServerGuard | None = None,
    ) -> None:
        self._queues = queues
        self._store = store
        self._clock = clock
        self._guard = guard if guard is not None else ServerGuard()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of every admin method (for ``proto.serve.start_server``)."""
        methods: dict[str, tuple[Callable[[Any, Any], Awaitable[Any]], Any, Any]] = {
            "ListQueues": (self.list_queues, pb.ListQueuesRequest, pb.ListQueuesReply),
            "QueueStats": (self.queue_stats, pb.QueueRequest, pb.QueueStatsReply),
            "Peek": (self.peek, pb.PeekRequest, pb.PeekReply),
            "Purge": (self.purge, pb.QueueRequest, pb.CountReply),
            "Delete": (self.delete, pb.QueueRequest, pb.CountReply),
            "SetPolicy": (self.set_policy, pb.SetPolicyRequest, pb.PolicyReply),
            "GetPolicy": (self.get_policy, pb.QueueRequest, pb.PolicyReply),
            "ReplayDeadLetters": (self.replay, pb.QueueRequest, pb.CountReply),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                _guarded(method, reply, self._guard),
                request_deserializer=request.FromString,
                response_serializer=reply.SerializeToString,
            )
            for name, (method, request, reply) in methods.items()
        }
        return grpc.method_handlers_generic_handler(ADMIN_SERVICE, handlers)

    async def list_queues(self, request: pb.ListQueuesRequest, context: Any) -> pb.ListQueuesReply:
        """Every queue the broker holds now, sorted by URI."""
        queues = sorted(self._queues, key=lambda queue: queue.uri)
        return pb.ListQueuesReply(status=pb.STATUS_OK, queues=[self._stats(q) for q in queues])

    async def queue_stats(self, request: pb.QueueRequest, context: Any) -> pb.QueueStatsReply:
        """One queue's depth, consumers, counters and policy."""
        return pb.QueueStatsReply(status=pb.STATUS_OK, stats=self._stats(self._find(request.uri)))

    async def peek(self, request: pb.PeekRequest, context: Any) -> pb.PeekReply:
        """The first ``count`` ready messages, in delivery order, left in place."""
        queue = self._find(request.uri)
        count = min(request.count or 10, MAX_PEEK)
        now = self._clock()
        reply = pb.PeekReply(status=pb.STATUS_OK)
        for index, message in enumerate(queue.ready):
            if index >= count:
                break
            reply.messages.add(
                guid=message.guid,
                payload=message.payload,
                properties=message.properties,
                delivery_count=message.delivery_count,
                age_seconds=max(0.0, now - message.accepted_at),
            )
        return reply

    async def purge(self, request: pb.QueueRequest, context: Any) -> pb.CountReply:
        """Remove the ready (and delayed) messages; consumers keep their unconfirmed ones."""
        parse_queue_uri(request.uri)
        count, batch = self._queues.purge(request.uri)
        await self._write(batch)
        log.info("admin: purged %d messages of %s", count, request.uri)
        return pb.CountReply(status=pb.STATUS_OK, count=count)

    async def delete(self, request: pb.QueueRequest, context: Any) -> pb.CountReply:
        """Delete an unused queue with its messages, history and policy."""
        parse_queue_uri(request.uri)
        count, batch = self._queues.delete(request.uri)
        await self._write(batch)
        log.info("admin: deleted %s with %d messages", request.uri, count)
        return pb.CountReply(status=pb.STATUS_OK, count=count)

    async def set_policy(self, request: pb.SetPolicyRequest, context: Any) -> pb.PolicyReply:
        """Replace the policy of a queue (creating it if it does not exist) or of a
        template (``hf://<domain>/<prefix>*``)."""
        check_policy_uri(request.uri)
        policy = QueuePolicy.from_wire(request.policy)
        batch = self._queues.set_policy(request.uri, policy)
        await self._write(batch)
        log.info("admin: policy of %s is now %s", request.uri, policy)
        return pb.PolicyReply(status=pb.STATUS_OK, policy=policy.to_wire())

    async def get_policy(self, request: pb.QueueRequest, context: Any) -> pb.PolicyReply:
        """The policy in force at a queue (its own or its template's) or a template."""
        check_policy_uri(request.uri)
        policy = self._queues.policy_of(request.uri)
        if policy is None:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue or template {request.uri} on this broker")
        return pb.PolicyReply(status=pb.STATUS_OK, policy=policy.to_wire())

    async def replay(self, request: pb.QueueRequest, context: Any) -> pb.CountReply:
        """Move every ready message of a dead-letter queue back to its original queue,
        once each (the removal and the copy commit together)."""
        queue = self._find(request.uri)
        moving, problems = self._queues.graveyard.replay(queue)
        await self._queues.graveyard.wait()
        # A move the store refused put its messages back (logged): not counted.
        moved = [message for message in moving if message.guid not in queue.live]
        if len(moved) < len(moving):
            raise Invalid(
                pb.STATUS_STORE_ERROR,
                f"the store failed to move {len(moving) - len(moved)} of {len(moving)} "
                "messages; they stay in the dead-letter queue (see the broker's log)",
            )
        text = ""
        if problems:
            text = f"{len(problems)} messages left in place: " + "; ".join(list(problems)[:5])
        log.info("admin: replayed %d dead letters of %s", len(moving), request.uri)
        return pb.CountReply(status=pb.STATUS_OK, count=len(moving), message=text)

    def _find(self, uri: str) -> Queue:
        parse_queue_uri(uri)
        queue = self._queues.get(uri)
        if queue is None:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue {uri} on this broker")
        return queue

    async def _write(self, batch: StoreBatch) -> None:
        try:
            await self._store.write(batch)
        except Exception as error:
            log.exception("admin: the store failed to record a change")
            raise Invalid(pb.STATUS_STORE_ERROR, f"the store failed: {error}") from error

    def _stats(self, queue: Queue) -> pb.QueueStats:
        oldest = queue.oldest_accepted_at()
        return pb.QueueStats(
            uri=queue.uri,
            ready=len(queue.ready) + len(queue.delayed),
            unconfirmed=queue.unconfirmed,
            bytes=queue.live_bytes,
            consumers=len(queue.consumers),
            handles=queue.handles,
            oldest_age_seconds=0.0 if oldest is None else max(0.0, self._clock() - oldest),
            accepted=queue.accepted,
            redelivered=queue.redelivered,
            rejected=queue.rejected,
            dead_lettered=sum(queue.dead.values()),
            expired=queue.dead["expired"],
            policy=queue.policy.to_wire(),
        )


def _guarded(
    method: Callable[[Any, Any], Awaitable[Reply]], reply: type[Any], guard: ServerGuard
) -> Callable[[Any, Any], Awaitable[Reply]]:
    """Refuse a caller without an admin token (with ``--auth-file``), and answer
    ``Invalid`` with its typed status in the reply (a bug still fails the call with
    gRPC's UNKNOWN status, which the CLI reports as such)."""

    async def call(request: Any, context: Any) -> Reply:
        refusal = unary_refusal(guard, context, None, write=False, admin=True)
        if refusal is not None:
            refused: Reply = reply(status=refusal[0], message=refusal[1])
            return refused
        try:
            return await method(request, context)
        except Invalid as error:
            answer: Reply = reply(status=error.status, message=error.message)
            return answer

    return call


__all__ = ["MAX_PEEK", "AdminService"]

"""One client session of the broker: what each frame does to the broker's queues.

The stream itself (framing, the Hello handshake, reading and writing) is
``holdfast.server.stream.ContractStream``; this subclass applies the frames to the
broker's state. Reading is synchronous per frame: anything that must wait (a store
write) continues in a task of the PUT path while its ACKs hold their place in the
outbox. When the stream ends, however it ends, the session's consumers are
detached, so their unconfirmed messages are redelivered to the queue's other
consumers.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter
from typing import Any, Generic

from holdfast.broker.config import BrokerConfig
from holdfast.broker.consumers import Consumer, FlowLimits, QueueHandle
from holdfast.broker.interfaces import PutPath, Q, SessionQueues
from holdfast.broker.writer import Writer
from holdfast.proto import pb
from holdfast.proto.columns import PutColumns, RejectRow
from holdfast.proto.limits import MAX_REJECT_DELAY_MS, hello_reply
from holdfast.proto.validate import Invalid, check_open, parse_queue_uri
from holdfast.server.guard import SessionGuard
from holdfast.server.spans import accept_spans
from holdfast.server.stream import ContractStream


class Session(ContractStream, Generic[Q]):
    """Serves one ``holdfast.v1.Broker/Session`` stream from the broker's queues (of
    queue type ``Q``: the store's, see ``interfaces``)."""

    def __init__(
        self,
        context: Any,
        session_id: str,
        broker_id: str,
        config: BrokerConfig,
        queues: SessionQueues[Q],
        puts: PutPath[Q],
        guard: SessionGuard | None = None,
    ) -> None:
        super().__init__(
            context, session_id, config.max_frame_bytes, config.session_read_bound_bytes, guard
        )
        self._broker_id = broker_id
        self._config = config
        self._queues = queues
        self._puts = puts
        self._handles: dict[int, QueueHandle[Q]] = {}
        self._writer = Writer(self.guard, session_id)
        # PUSHes carry their message's age on the clock its acceptance time is on.
        self.outbox.clock = queues.now

    def queue_ids(self, uri: str) -> list[int]:
        """The handles this session has open on ``uri``."""
        return [qid for qid, handle in self._handles.items() if handle.queue.uri == uri]

    def stop(self, message: str = "the broker is stopping") -> None:
        """End the session from the broker's side (see ``ContractStream.stop``)."""
        super().stop(message)

    def greet(self, hello: pb.Hello) -> None:
        """Answer Hello with this broker's dedup window and limits."""
        self.send(hello_reply(self.session_id, self._config.limits, self._broker_id))

    def on_open(self, request: pb.OpenQueue) -> None:
        """Open a queue handle (a consumer if read): answer OK or a typed status."""
        try:
            check_open(request.uri, request.read, request.write)
        except Invalid as error:
            self.respond(request.request_id, error.status, error.message)
            return
        refusal = self.guard.check_open(
            parse_queue_uri(request.uri).domain,
            request.read,
            request.write,
            self._queues.get(request.uri) is None,
            self.session_id,
            request.for_client,
        )
        if refusal is not None:
            self.respond(request.request_id, *refusal)
            return
        queue_id = request.queue_id
        if queue_id in self._handles:
            self.respond(
                request.request_id,
                pb.STATUS_ALREADY_OPEN,
                f"queue_id {queue_id} is already open ({self._handles[queue_id].queue.uri})",
            )
            return
        queue = self._queues.open(request.uri)
        consumer = None
        if request.read:
            options = request.options if request.HasField("options") else None
            consumer = Consumer(queue_id, self.outbox, FlowLimits.from_wire(options))
        self._handles[queue_id] = QueueHandle(
            queue_id, queue, request.read, request.write, consumer
        )
        queue.handles += 1
        self.guard.open_queues += 1
        # The outbox writes no PUSH before this Response, so the client learns that the
        # handle is open before it receives messages on it.
        self.respond(request.request_id, pb.STATUS_OK, holds_pushes=consumer is not None)
        if consumer is not None:
            queue.attach(consumer)

    def on_configure(self, request: pb.ConfigureQueue) -> None:
        """Change a consumer's flow limits; delivery resumes if they allow."""
        handle = self._handles.get(request.queue_id)
        if handle is None:
            self.respond_not_open(request.request_id, request.queue_id)
            return
        if handle.consumer is not None:
            options = request.options if request.HasField("options") else None
            handle.consumer.limits = FlowLimits.from_wire(options)
            handle.queue.deliver()
        self.respond(request.request_id, pb.STATUS_OK)

    def on_close(self, request: pb.CloseQueue) -> None:
        """Close a queue handle; its unconfirmed messages go back to the queue."""
        handle = self._handles.pop(request.queue_id, None)
        if handle is None:
            self.respond_not_open(request.request_id, request.queue_id)
            return
        self._detach(handle)
        self.respond(request.request_id, pb.STATUS_OK)

    def on_puts(self, batch: PutColumns) -> None:
        """Validate, dedup, store and enqueue a batch of PUTs (see ``puts``)."""
        puts = batch
        spans = accept_spans(puts, self._handles)  # None unless a trace is being recorded
        self._puts.on_put_batch(puts, self._handles, self.outbox, self._writer, spans)

    def on_confirms(self, batch: list[tuple[int, bytes]]) -> None:
        """Remove confirmed messages; refuse GUIDs this consumer does not hold. A run
        of one handle's CONFIRMs (a batch is mostly one) is settled at once."""
        handles = self._handles
        rejected: dict[tuple[pb.Status, int], list[bytes]] = {}
        touched: dict[int, Q] = {}
        for queue_id, run in groupby(batch, itemgetter(0)):
            guids = list(map(itemgetter(1), run))
            handle = handles.get(queue_id)
            if handle is None:
                refused, status = guids, pb.STATUS_UNKNOWN_QUEUE
            elif handle.consumer is None:
                refused, status = guids, pb.STATUS_NOT_READABLE
            else:
                refused, status = (
                    handle.queue.confirm_run(handle.consumer, guids),
                    pb.STATUS_UNKNOWN_GUID,
                )
                if len(refused) < len(guids):
                    touched[queue_id] = handle.queue
            if refused:
                rejected.setdefault((status, queue_id), []).extend(refused)
        for queue in touched.values():
            queue.deliver()
        self.reject_confirms(rejected)

    def on_rejects(self, batch: list[RejectRow]) -> None:
        """Give rejected messages back to their queue (or its dead-letter queue);
        refuse GUIDs this consumer does not hold, like CONFIRMs."""
        refused: dict[tuple[pb.Status, int], list[bytes]] = {}
        touched: dict[int, Q] = {}
        for queue_id, guid, requeue, delay_ms in batch:
            handle = self._handles.get(queue_id)
            if handle is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif handle.consumer is None:
                status = pb.STATUS_NOT_READABLE
            elif handle.queue.reject(
                handle.consumer,
                guid,
                requeue,
                min(delay_ms, MAX_REJECT_DELAY_MS) / 1000,
            ):
                touched[queue_id] = handle.queue
                continue
            else:
                status = pb.STATUS_UNKNOWN_GUID
            refused.setdefault((status, queue_id), []).append(guid)
        for queue in touched.values():
            queue.deliver()
        self.reject_confirms(refused)

    def on_count_consumers(self, request: pb.CountConsumers) -> None:
        """Service discovery: the live consumers of a queue (0 for one never opened)."""
        try:
            domain = parse_queue_uri(request.uri).domain
        except Invalid as error:
            self.count_answer(request.request_id, 0, error.status, error.message)
            return
        refusal = self.guard.check_read(domain)
        if refusal is not None:
            self.count_answer(request.request_id, 0, *refusal)
            return
        self._queues.count_consumers(
            request.uri, lambda count: self.count_answer(request.request_id, count)
        )

    def _detach(self, handle: QueueHandle[Q]) -> None:
        handle.queue.handles -= 1
        self.guard.open_queues -= 1
        if handle.consumer is not None:
            # PUSHes not written yet go back to the queue with the rest.
            self.outbox.drop_pushes(handle.queue_id)
            self.outbox.revoked.forget(handle.queue_id)
            handle.queue.detach(handle.consumer)

    def on_end(self) -> None:
        """Detach this session's consumers; their unconfirmed messages are redelivered."""
        handles = list(self._handles.values())
        self._handles.clear()
        self.guard.open_queues = 0
        # Detach every consumer before redelivering, so that messages returned by one
        # handle of this session are not pushed to another handle of it that is going too.
        queues: dict[int, Q] = {}
        for handle in handles:
            handle.queue.handles -= 1
            if handle.consumer is not None:
                self.outbox.drop_pushes(handle.queue_id)
                handle.queue.detach(handle.consumer, redeliver=False)
                queues[id(handle.queue)] = handle.queue
        for queue in queues.values():
            queue.deliver()

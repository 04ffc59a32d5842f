"""One client session: the protocol spoken on one gRPC stream.

A session reads client frames in one task and writes server frames in another
(see ``outbox``). Reading is synchronous per frame: a frame is parsed, checked and
applied to the broker's state before the next one is read, and anything that must
wait (a store write) continues in a task of the PUT path while its ACKs hold
their place in the outbox.

Rules of the stream:

* bytes that do not parse, or a frame of a kind this broker does not know, are
  answered with an Error (MALFORMED_FRAME, UNKNOWN_FRAME) and the stream goes on;
* the first known frame must be a Hello of this protocol version; anything else, or
  a second Hello, is a fatal Error (PROTOCOL_ERROR, VERSION_MISMATCH): the error is
  sent and the stream ends;
* when the stream ends, however it ends, the session's consumers are detached, so
  their unconfirmed messages are redelivered to the queue's other consumers.

A failure inside one session is logged and ends that stream only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from holdfast.broker.config import BrokerConfig
from holdfast.broker.outbox import Outbox
from holdfast.broker.puts import PutPipeline
from holdfast.broker.queues import Consumer, FlowLimits, Queue, QueueHandle, QueueRegistry
from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.proto.uri import parse_queue_uri

log = logging.getLogger(__name__)

FLUSH_TIMEOUT = 5.0
"""Seconds an ending session waits for its last ACKs and responses to be written."""


class Session:
    """Serves one ``holdfast.v1.Broker/Session`` stream."""

    def __init__(
        self,
        context: Any,
        session_id: str,
        broker_id: str,
        config: BrokerConfig,
        queues: QueueRegistry,
        puts: PutPipeline,
    ) -> None:
        self.session_id = session_id
        self.peer: str = context.peer()
        self.client_id = ""
        self.client_name = ""
        self._context = context
        self._broker_id = broker_id
        self._config = config
        self._queues = queues
        self._puts = puts
        self._outbox = Outbox(config.max_frame_bytes, config.session_read_bound_bytes)
        self._handles: dict[int, QueueHandle] = {}
        self._greeted = False
        self._ending = False
        self._end_reason = "stream cancelled"
        self._reader: asyncio.Task[None] | None = None
        self._dispatch: dict[str, Callable[[Any], None]] = {
            "hello": self._on_hello,
            "open_queue": self._on_open,
            "configure_queue": self._on_configure,
            "close_queue": self._on_close,
            "puts": self._on_puts,
            "confirms": self._on_confirms,
        }

    # -- the stream -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve the stream until the client leaves, a fatal error, or ``stop()``."""
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write_loop(), name=f"write {self.session_id}")
        reader = loop.create_task(self._read_loop(), name=f"read {self.session_id}")
        self._reader = reader
        writer.add_done_callback(self._on_writer_done)
        try:
            # wait() rather than await: a cancelled reader is an ending, not our cancel.
            await asyncio.wait([reader])
            if not reader.cancelled() and (error := reader.exception()) is not None:
                self._end_reason = f"internal error: {error!r}"
                log.error("session %s failed", self.session_id, exc_info=error)
                self._context.set_code(grpc.StatusCode.INTERNAL)
                self._context.set_details(f"broker error: {error!r}")
            self._outbox.finish()
            self._detach_all()
            await asyncio.wait([writer], timeout=FLUSH_TIMEOUT)
        finally:
            reader.cancel()
            writer.cancel()
            self._detach_all()
            self._outbox.close()
            log.info(
                "session %s ended (%s): client %r %s at %s",
                self.session_id,
                self._end_reason,
                self.client_id,
                self.client_name,
                self.peer,
            )

    def stop(self, message: str = "the broker is stopping") -> None:
        """End the session from the broker's side: tell the client why (best effort),
        stop reading, and let ``run()`` flush and return."""
        if not self._ending:
            self._fatal(pb.STATUS_SHUTTING_DOWN, message, reason="broker stopping")
        if self._reader is not None:
            self._reader.cancel()

    async def _read_loop(self) -> None:
        read = self._context.read
        outbox = self._outbox
        while not self._ending:
            if not outbox.has_room:
                log.info(
                    "session %s: %d bytes wait for the client to read them; "
                    "not reading its frames until it does",
                    self.session_id,
                    outbox.ordered_bytes,
                )
                await outbox.wait_for_room()
                log.info("session %s: the client caught up; reading again", self.session_id)
            raw = await read()
            if raw is grpc.aio.EOF:
                self._end_reason = (
                    "stream cancelled"
                    if self._context.cancelled()
                    else "end of the client's stream"
                )
                return
            self.on_bytes(raw)

    async def _write_loop(self) -> None:
        write = self._context.write
        outbox = self._outbox
        while True:
            frame = outbox.take()
            if frame is None:
                if outbox.closed or (outbox.finishing and not outbox.ordered_pending):
                    return
                await outbox.wait_for_work()
                continue
            await write(frame)

    def _on_writer_done(self, writer: asyncio.Task[None]) -> None:
        if writer.cancelled():
            return
        error = writer.exception()  # retrieved even when unused, so asyncio does not warn
        if error is not None and self._reader is not None and not self._reader.done():
            # The client is unreachable: stop reading too, and let run() clean up.
            self._end_reason = f"write failed: {error!r}"
            self._ending = True
            self._reader.cancel()

    # -- frames -----------------------------------------------------------------------

    def on_bytes(self, raw: bytes) -> None:
        """Parse and apply one client frame."""
        try:
            frame = pb.ClientFrame.FromString(raw)
        except DecodeError as error:
            self._error(
                pb.STATUS_MALFORMED_FRAME,
                f"{len(raw)} bytes that do not parse as a ClientFrame: {error}",
            )
            return
        kind = frame.WhichOneof("frame")
        if kind is None:
            self._error(pb.STATUS_UNKNOWN_FRAME, "a ClientFrame with no frame this broker knows")
            return
        if not self._greeted and kind != "hello":
            self._fatal(pb.STATUS_PROTOCOL_ERROR, f"expected hello as the first frame, got {kind}")
            return
        self._dispatch[kind](getattr(frame, kind))

    def _on_hello(self, hello: pb.Hello) -> None:
        if self._greeted:
            self._fatal(pb.STATUS_PROTOCOL_ERROR, "a second hello on the same stream")
            return
        if hello.protocol_version != PROTOCOL_VERSION:
            self._fatal(
                pb.STATUS_VERSION_MISMATCH,
                f"the client speaks protocol version {hello.protocol_version}; "
                f"this broker speaks version {PROTOCOL_VERSION}",
            )
            return
        self._greeted = True
        self.client_id = hello.client_id
        self.client_name = hello.client_name
        config = self._config
        reply = pb.HelloReply(
            protocol_version=PROTOCOL_VERSION,
            session_id=self.session_id,
            dedup_window_ms=round(config.dedup_window * 1000),
            max_payload_bytes=config.max_payload_bytes,
            max_properties=config.max_properties,
            max_properties_bytes=config.max_properties_bytes,
            broker_id=self._broker_id,
        )
        self._outbox.send(pb.ServerFrame(hello_reply=reply))
        log.info(
            "session %s started: client %r %s at %s",
            self.session_id,
            self.client_id,
            self.client_name,
            self.peer,
        )

    def _on_open(self, request: pb.OpenQueue) -> None:
        try:
            parse_queue_uri(request.uri)
        except ValueError as error:
            self._respond(request.request_id, pb.STATUS_INVALID_ARGUMENT, str(error))
            return
        queue_id = request.queue_id
        if queue_id in self._handles:
            self._respond(
                request.request_id,
                pb.STATUS_ALREADY_OPEN,
                f"queue_id {queue_id} is already open ({self._handles[queue_id].queue.uri})",
            )
            return
        if not request.read and not request.write:
            self._respond(
                request.request_id,
                pb.STATUS_INVALID_ARGUMENT,
                "open a queue with read, write or both",
            )
            return
        queue = self._queues.open(request.uri)
        consumer = None
        if request.read:
            options = request.options if request.HasField("options") else None
            consumer = Consumer(queue_id, self._outbox, FlowLimits.from_wire(options))
        self._handles[queue_id] = QueueHandle(
            queue_id, queue, request.read, request.write, consumer
        )
        # The outbox writes no PUSH before this Response, so the client learns that the
        # handle is open before it receives messages on it.
        self._respond(request.request_id, pb.STATUS_OK, holds_pushes=consumer is not None)
        if consumer is not None:
            queue.attach(consumer)

    def _on_configure(self, request: pb.ConfigureQueue) -> None:
        handle = self._handles.get(request.queue_id)
        if handle is None:
            self._respond(
                request.request_id,
                pb.STATUS_UNKNOWN_QUEUE,
                f"queue_id {request.queue_id} is not open",
            )
            return
        if handle.consumer is not None:
            options = request.options if request.HasField("options") else None
            handle.consumer.limits = FlowLimits.from_wire(options)
            handle.queue.deliver()
        self._respond(request.request_id, pb.STATUS_OK)

    def _on_close(self, request: pb.CloseQueue) -> None:
        handle = self._handles.pop(request.queue_id, None)
        if handle is None:
            self._respond(
                request.request_id,
                pb.STATUS_UNKNOWN_QUEUE,
                f"queue_id {request.queue_id} is not open",
            )
            return
        self._detach(handle)
        self._respond(request.request_id, pb.STATUS_OK)

    def _on_puts(self, batch: pb.PutBatch) -> None:
        self._puts.on_put_batch(batch.puts, self._handles, self._outbox)

    def _on_confirms(self, batch: pb.ConfirmBatch) -> None:
        handles = self._handles
        rejected: dict[tuple[pb.Status, int], list[bytes]] = {}
        touched: dict[int, Queue] = {}
        last_id = -1
        handle: QueueHandle | None = None
        for confirm in batch.confirms:
            queue_id = confirm.queue_id
            if queue_id != last_id:
                handle = handles.get(queue_id)
                last_id = queue_id
            guid = confirm.guid
            if handle is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif handle.consumer is None:
                status = pb.STATUS_NOT_READABLE
            elif handle.queue.confirm(handle.consumer, guid):
                touched[queue_id] = handle.queue
                continue
            else:
                status = pb.STATUS_UNKNOWN_GUID
            rejected.setdefault((status, queue_id), []).append(guid)
        for queue in touched.values():
            queue.deliver()
        for (status, queue_id), guids in rejected.items():
            self._error(status, _CONFIRM_ERRORS[status], queue_id, guids)

    # -- helpers ----------------------------------------------------------------------

    def _respond(
        self,
        request_id: int,
        status: pb.Status,
        message: str = "",
        holds_pushes: bool = False,
    ) -> None:
        response = pb.Response(request_id=request_id, status=status, message=message)
        self._outbox.send(pb.ServerFrame(response=response), holds_pushes)

    def _error(
        self,
        status: pb.Status,
        message: str,
        queue_id: int = 0,
        guids: Iterable[bytes] = (),
        fatal: bool = False,
    ) -> None:
        error = pb.Error(
            status=status, message=message, queue_id=queue_id, guids=guids, fatal=fatal
        )
        self._outbox.send(pb.ServerFrame(error=error))
        if not fatal:
            log.debug("session %s: %s: %s", self.session_id, pb.Status.Name(status), message)

    def _fatal(self, status: pb.Status, message: str, reason: str | None = None) -> None:
        self._error(status, message, fatal=True)
        self._ending = True
        self._end_reason = reason or f"{pb.Status.Name(status)}: {message}"

    def _detach(self, handle: QueueHandle) -> None:
        if handle.consumer is not None:
            # PUSHes not written yet go back to the queue with the rest.
            self._outbox.drop_pushes(handle.queue_id)
            handle.queue.detach(handle.consumer)

    def _detach_all(self) -> None:
        handles = list(self._handles.values())
        self._handles.clear()
        # Detach every consumer before redelivering, so that messages returned by one
        # handle of this session are not pushed to another handle of it that is going too.
        queues: dict[int, Queue] = {}
        for handle in handles:
            if handle.consumer is not None:
                self._outbox.drop_pushes(handle.queue_id)
                handle.queue.detach(handle.consumer, redeliver=False)
                queues[id(handle.queue)] = handle.queue
        for queue in queues.values():
            queue.deliver()


_CONFIRM_ERRORS: dict[pb.Status, str] = {
    pb.STATUS_UNKNOWN_QUEUE: "CONFIRM on a queue_id that is not open",
    pb.STATUS_NOT_READABLE: "CONFIRM on a queue handle opened without read",
    pb.STATUS_UNKNOWN_GUID: "CONFIRM of GUIDs this consumer does not hold unconfirmed",
}

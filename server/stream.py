"""One served session stream of the contract: framing, the Hello handshake, the writer.

The broker's sessions (``holdfast.broker.session``) and the proxy's client
sessions (``holdfast.proxy.client``) speak the same protocol downstream; this base
class is that protocol's stream half, and subclasses supply what each frame does.
It knows nothing of either: a server binds it with ``holdfast.server.serve``.

A stream reads client frames in one task and writes server frames in another
(see ``outbox``). Reading is synchronous per frame: a frame is parsed, checked and
handed to its handler before the next one is read; anything that must wait
continues in a task while its answers hold their place in the outbox.

Rules of the stream:

* bytes that do not parse, or a frame of a kind this server does not know, are
  answered with an Error (MALFORMED_FRAME, UNKNOWN_FRAME) and the stream goes on
  (before the Hello, bytes that do not parse are a fatal MALFORMED_FRAME);
* the first known frame must be a Hello of this protocol version, within the guard's
  ``hello_timeout`` (``--hello-timeout``); anything else, or none, or a second Hello,
  is a fatal Error (PROTOCOL_ERROR, VERSION_MISMATCH): it is sent and the stream ends;
* a ``batch`` (``ClientFrames``) is handled frame by frame, in order, as if each had
  come alone; a Hello or a batch inside one is a fatal PROTOCOL_ERROR. To a client
  whose Hello set ``accepts_batches`` the writer sends what is ready as one
  ``ServerFrames`` message (``holdfast.proto.batching``), never more than a frame's
  size, once the loop has run what was ready (``holdfast.sdk.turns``);
* when the stream ends, however it ends, ``on_end()`` runs (the broker detaches
  consumers so their messages are redelivered; the proxy closes upstream handles).

A failure inside one stream is logged and ends that stream only.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from holdfast.proto import PROTOCOL_VERSION, pb, status_name
from holdfast.proto.batching import BATCH_OVERHEAD, pack
from holdfast.proto.columns import (
    Malformed,
    PutColumns,
    RejectRow,
    read_confirms,
    read_puts,
    read_rejects,
)
from holdfast.sdk.turns import before_taking
from holdfast.server.answers import CONFIRM_ERRORS, Answers
from holdfast.server.guard import ServerGuard, SessionGuard, pause
from holdfast.server.outbox import Outbox

log = logging.getLogger(__name__)

FLUSH_TIMEOUT = 5.0
"""Seconds an ending stream waits for its last ACKs and responses to be written."""


class ContractStream(Answers, ABC):
    """Serves one ``holdfast.v1.Broker/Session`` stream; subclasses handle the frames."""

    def __init__(
        self,
        context: Any,
        session_id: str,
        max_frame_bytes: int,
        read_bound_bytes: int,
        guard: SessionGuard | None = None,
    ) -> None:
        self.session_id = session_id
        self.guard = guard if guard is not None else ServerGuard().session(None)
        """The session's token grant and limits (``holdfast.server.guard``)."""
        self.peer: str = context.peer()
        self.client_id = ""
        self.client_name = ""
        self.outbox = Outbox(max_frame_bytes, read_bound_bytes)
        """What this stream has to send; handlers queue answers here."""
        self._context = context
        self._greeted = False
        self._peer_batches = False
        """Whether the client reads ``ServerFrames`` (its Hello said so)."""
        self._ending = False
        self._end_reason = "stream cancelled"
        self._reader: asyncio.Task[None] | None = None
        self._dispatch: dict[str, Callable[[Any], None]] = {
            "hello": self._on_hello,
            "open_queue": self.on_open,
            "configure_queue": self.on_configure,
            "close_queue": self.on_close,
            "puts": self._columns(read_puts, self.on_puts),
            "confirms": self._columns(read_confirms, self.on_confirms),
            "rejects": self._columns(read_rejects, self.on_rejects),
            "count_consumers": self.on_count_consumers,
        }

    # -- what subclasses do -----------------------------------------------------------

    @abstractmethod
    def greet(self, hello: pb.Hello) -> None:
        """A valid Hello arrived: send the HelloReply (now, or once it can be answered)."""

    @abstractmethod
    def on_open(self, request: pb.OpenQueue) -> None:
        """Handle OpenQueue; answer with ``respond``."""

    @abstractmethod
    def on_configure(self, request: pb.ConfigureQueue) -> None:
        """Handle ConfigureQueue; answer with ``respond``."""

    @abstractmethod
    def on_close(self, request: pb.CloseQueue) -> None:
        """Handle CloseQueue; answer with ``respond``."""

    @abstractmethod
    def on_puts(self, batch: PutColumns) -> None:
        """Handle a PutBatch's columns; every PUT gets exactly one ACK through the outbox."""

    @abstractmethod
    def on_confirms(self, batch: list[tuple[int, bytes]]) -> None:
        """Handle a ConfirmBatch as (queue_id, guid) rows; rejected CONFIRMs are answered
        with ``error``."""

    @abstractmethod
    def on_rejects(self, batch: list[RejectRow]) -> None:
        """Handle a RejectBatch's rows; refused REJECTs are answered like refused CONFIRMs."""

    def _columns(
        self, read: Callable[[Any], Any], handle: Callable[[Any], None]
    ) -> Callable[[Any], None]:
        """A frame handler that reads a columnar batch once, then hands it on; a batch
        whose columns disagree is answered MALFORMED_FRAME and nothing of it is taken."""

        def on_batch(batch: Any) -> None:
            try:
                columns = read(batch)
            except Malformed as error:
                self.error(error.status, error.message)
                return
            handle(columns)

        return on_batch

    @abstractmethod
    def on_count_consumers(self, request: pb.CountConsumers) -> None:
        """Handle CountConsumers; answer with ``count_answer``."""

    @abstractmethod
    def on_end(self) -> None:
        """The stream is over: release what this client held."""

    async def wait_before_read(self) -> None:
        """Return once another client frame may be read: not while the client leaves
        its answers unread (subclasses add their own back-pressure)."""
        outbox = self.outbox
        if not outbox.has_room:
            log.info(
                "session %s: %d bytes wait for the client to read them; "
                "not reading its frames until it does",
                self.session_id,
                outbox.ordered_bytes,
            )
            await outbox.wait_for_room()
            log.info("session %s: the client caught up; reading again", self.session_id)

    # -- the stream ---------------------------------------------------------------------

    @property
    def ending(self) -> bool:
        """True once the stream is ending: nothing more is read."""
        return self._ending

    async def run(self) -> None:
        """Serve the stream until the client leaves, a fatal error, or ``stop()``."""
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write_loop(), name=f"write {self.session_id}")
        reader = loop.create_task(self._read_loop(), name=f"read {self.session_id}")
        self._reader = reader
        writer.add_done_callback(self._on_writer_done)
        hello_deadline = loop.call_later(self.guard.limits.hello_timeout, self._hello_overdue)
        try:
            # wait() rather than await: a cancelled reader is an ending, not our cancel.
            await asyncio.wait([reader])
            if not reader.cancelled() and (error := reader.exception()) is not None:
                self._end_reason = f"internal error: {error!r}"
                log.error("session %s failed", self.session_id, exc_info=error)
                self._context.set_code(grpc.StatusCode.INTERNAL)
                self._context.set_details(f"server error: {error!r}")
            self._ending = True
            self.outbox.finish()
            self.on_end()
            await asyncio.wait([writer], timeout=FLUSH_TIMEOUT)
        finally:
            hello_deadline.cancel()
            self._ending = True
            reader.cancel()
            writer.cancel()
            self.on_end()
            self.outbox.close()
            log.info(
                "session %s ended (%s): client %r %s at %s",
                self.session_id,
                self._end_reason,
                self.client_id,
                self.client_name,
                self.peer,
            )

    def stop(self, message: str) -> None:
        """End the stream from the server's side: tell the client why (best effort),
        stop reading, and let ``run()`` flush and return."""
        if not self._ending:
            self.fatal(pb.STATUS_SHUTTING_DOWN, message, reason="server stopping")
        if self._reader is not None:
            self._reader.cancel()

    def _hello_overdue(self) -> None:
        if self._greeted or self._ending:
            return
        seconds = self.guard.limits.hello_timeout
        self.fatal(pb.STATUS_PROTOCOL_ERROR, f"no hello within {seconds:g} s", reason="no hello")
        if self._reader is not None:
            self._reader.cancel()

    async def _read_loop(self) -> None:
        read = self._context.read
        guard = self.guard
        while not self._ending:
            await self.wait_before_read()
            delay = guard.frame_delay()
            if delay > 0:
                if guard.should_tell():
                    self.error(
                        pb.STATUS_LIMIT_EXCEEDED,
                        f"over {guard.limits.frames_per_second} frames a second: reading paused",
                    )
                await pause(delay)
            raw = await read()
            if raw is grpc.aio.EOF:
                cancelled = self._context.cancelled()
                self._end_reason = "stream cancelled" if cancelled else "end of the client's stream"
                return
            self.on_bytes(raw)

    async def _write_loop(self) -> None:
        write = self._context.write
        outbox = self.outbox
        last_bytes = 0
        while True:
            frame = outbox.take()
            if frame is None:
                if outbox.closed or (outbox.finishing and not outbox.ordered_pending):
                    return
                await outbox.wait_for_work()
                await before_taking(last_bytes)  # small answers leave together
                continue
            if not self._peer_batches:
                await write(frame)
                last_bytes = frame.ByteSize()
                continue
            # What is ready leaves as one gRPC message (ServerFrames), in take order,
            # up to a frame's size: an AckBatch and a PushBatch at once, typically.
            data: bytes | None = frame.SerializeToString()
            limit = outbox.max_frame_bytes
            while data is not None:
                group = [data]
                size = len(data) + BATCH_OVERHEAD
                data = None
                while size < limit and (following := outbox.take()) is not None:
                    data = following.SerializeToString()
                    if size + len(data) + BATCH_OVERHEAD > limit:
                        break  # it starts the next message
                    group.append(data)
                    size += len(data) + BATCH_OVERHEAD
                    data = None
                message = group[0] if len(group) == 1 else pack(group)
                last_bytes = len(message)
                await write(message)

    def _on_writer_done(self, writer: asyncio.Task[None]) -> None:
        if writer.cancelled():
            return
        error = writer.exception()  # retrieved even when unused, so asyncio does not warn
        if error is not None and self._reader is not None and not self._reader.done():
            # The client is unreachable: stop reading too, and let run() clean up.
            self._end_reason = f"write failed: {error!r}"
            self._ending = True
            self._reader.cancel()

    # -- frames -------------------------------------------------------------------------

    def on_bytes(self, raw: bytes) -> None:
        """Parse one client frame and hand it to its handler (each frame of a batch in
        turn, as if it had come alone)."""
        try:
            frame = pb.ClientFrame.FromString(raw)
        except DecodeError as error:
            problem = f"{len(raw)} bytes that do not parse as a ClientFrame: {error}"
            if self._greeted:
                self.error(pb.STATUS_MALFORMED_FRAME, problem)
            else:  # not a client of this contract, or not yet one: it gets no second try
                self.fatal(pb.STATUS_MALFORMED_FRAME, f"before hello: {problem}")
            return
        if frame.WhichOneof("frame") != "batch":
            self._on_frame(frame, batched=False)
            return
        for each in frame.batch.frames:
            if self._ending:
                return  # a fatal error in an earlier frame ended the stream
            self._on_frame(each, batched=True)

    def _on_frame(self, frame: pb.ClientFrame, batched: bool) -> None:
        kind = frame.WhichOneof("frame")
        if kind is None:
            self.error(pb.STATUS_UNKNOWN_FRAME, "a ClientFrame with no frame this server knows")
            return
        if batched and kind in ("hello", "batch"):
            self.fatal(pb.STATUS_PROTOCOL_ERROR, f"a {kind} frame inside a batch")
            return
        if not self._greeted and kind != "hello":
            self.fatal(pb.STATUS_PROTOCOL_ERROR, f"expected hello as the first frame, got {kind}")
            return
        self.dispatch(kind, getattr(frame, kind))

    def dispatch(self, kind: str, message: Any) -> None:
        """Hand a frame's message to its handler (a subclass may hold it back first)."""
        self._dispatch[kind](message)

    def _on_hello(self, hello: pb.Hello) -> None:
        if self._greeted:
            self.fatal(pb.STATUS_PROTOCOL_ERROR, "a second hello on the same stream")
            return
        refusal = self.guard.refusal()
        if refusal is not None:
            self.fatal(pb.STATUS_UNAUTHENTICATED, refusal)
            return
        if hello.protocol_version != PROTOCOL_VERSION:
            self.fatal(
                pb.STATUS_VERSION_MISMATCH,
                f"the client speaks protocol version {hello.protocol_version}; "
                f"this server speaks version {PROTOCOL_VERSION}",
            )
            return
        self._greeted = True
        self._peer_batches = hello.accepts_batches
        self.client_id = hello.client_id
        self.client_name = hello.client_name
        if not self.guard.relaying(hello.relays_clients):
            log.warning(
                'session %s relays clients, but its token may not (no "proxy": true): '
                "it is limited as one client",
                self.session_id,
            )
        self.greet(hello)
        log.info(
            "session %s started: client %r %s at %s",
            self.session_id,
            self.client_id,
            self.client_name,
            self.peer,
        )

    # -- answers (and ``Answers``) -----------------------------------------------------

    def reject_confirms(
        self, rejected: dict[tuple[pb.Status, int], list[bytes]], blameless: int = 0
    ) -> None:
        """One Error per (status, handle) naming the GUIDs; a session refused too many a
        second is ended, less ``blameless`` ones (a proxy's upstream reconnect) and
        those of deliveries it was told were revoked (``Outbox.revoked``)."""
        for (status, queue_id), guids in rejected.items():
            self.error(status, CONFIRM_ERRORS[status], queue_id, guids)
        blameless += self.outbox.revoked.forgive(rejected)
        counted = sum(len(guids) for guids in rejected.values()) - blameless
        if not self.guard.confirm_errors(counted):
            self.fatal(
                pb.STATUS_LIMIT_EXCEEDED,
                "too many refused CONFIRMs a second: this client confirms what it does not hold",
            )

    def refuse(self, details: str, reason: str) -> None:
        """End the stream with gRPC ``UNAVAILABLE`` and ``details`` (nothing sent in
        frames): a connection the client should retry, for a reason it can read."""
        self._context.set_code(grpc.StatusCode.UNAVAILABLE)
        self._context.set_details(details)
        self._ending = True
        self._end_reason = reason
        if self._reader is not None:
            self._reader.cancel()

    def fatal(self, status: pb.Status, message: str, reason: str | None = None) -> None:
        """Send a fatal Error and end the stream once it is written."""
        self.error(status, message, fatal=True)
        self._ending = True
        self._end_reason = reason or f"{status_name(status)}: {message}"

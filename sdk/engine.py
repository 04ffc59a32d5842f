"""The HA session engine: every client-HA rule of the Holdfast contract, in one place.

The engine has no sockets, no threads and no clock of its own (like ``h11``): it
takes inputs and produces outputs, and a shell (``holdfast.sdk.session`` in the
SDK, the proxy's upstream link) moves them. Tests drive it with scripted frames.

Inputs
    application calls   ``open_queue``, ``configure_queue``, ``close_queue``,
                        ``post``, ``confirm``, ``abandon_open``, ``close``
    the link            ``connection_made``, ``frame_received``, ``connection_lost``,
                        ``transport_drained``
    time                every input that depends on it takes ``now`` (monotonic seconds)

Outputs
    ``take_outbound()`` items to encode into frames (``holdfast.sdk.frames.encode``)
    ``take_callbacks()`` (function, argument) pairs to run on the application's
                         dispatcher thread: ACKs, PUSHed messages, session events
    ``take_completions()`` (request id, error or None) for open/configure/close

The link moves through these states::

    DISCONNECTED --connection_made--> HANDSHAKING --HelloReply--> RESTORING
         ^                                                           |  all queues reopened,
         |                                                           v  PUTs retransmitted
         +------------------------connection_lost--------------- ACTIVE
    (any) --close()--> CLOSED            (any) --terminal error--> FAILED

The rules (``docs/contract.md``), and where they live:

1. ``post`` assigns each PUT a uuid7 GUID and returns it.
2. Every PUT stays in ``_pending`` (keyed by GUID, in post order) until ACKed,
   whatever the link state; while not ACTIVE, ``post`` only buffers.
3. An ACK pops the PUT and reports it once (``_on_acks``); unknown GUIDs are ignored.
4. On HelloReply every queue that was open is reopened in open order, with its
   latest options (a configure pending at the drop is answered by that reopen);
   once all have answered, pending PUTs are retransmitted in post order, except
   those older than the broker's dedup window, reported UNKNOWN
   (``_finish_restore``). Events: ConnectionLost, Reconnected, QueueReopened per
   queue, StateRestored.
5. ``confirm`` raises ``ConfirmDroppedError`` unless the link is up and the
   message was delivered on this connection.
6. ``close_queue`` while not connected closes locally; the queue's pending PUTs
   are reported UNKNOWN and it is not reopened.
7. ``over_high_watermark`` says when outbound bytes not yet taken by the
   transport exceed the high watermark; the shell then holds ``post`` in the
   caller's thread for up to ``HIGH_WATERMARK_WAIT`` seconds.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from holdfast.proto import PROTOCOL_VERSION, pb, status_name
from holdfast.proto.limits import DEFAULT_LIMITS, Limits, limits_from_hello
from holdfast.proto.validate import Invalid, check_payload, check_properties, parse_queue_uri
from holdfast.sdk import events as ev
from holdfast.sdk.errors import (
    BandwidthLimitError,
    BufferFullError,
    ConfirmDroppedError,
    HoldfastError,
    InvalidArgumentError,
    NotWritableError,
    ProtocolVersionError,
    QueueNotOpenError,
    SessionClosedError,
    TerminalTransportError,
)
from holdfast.sdk.guids import Uuid7Source, uuid_from_bytes
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.statuses import ack_status, invalid_error, request_error, wire_status_of
from holdfast.sdk.types import Ack, AckStatus, Message

log = logging.getLogger("holdfast.sdk.engine")

HIGH_WATERMARK_WAIT = 5.0
"""Seconds ``post()`` waits for the outbound buffer to drain below its high watermark."""

PUT_OVERHEAD = 40
"""Bytes a PUT costs on the wire besides payload and properties (GUID, tags, lengths)."""


def _retransmit_margin(window: float) -> float:
    """Safety margin taken off the dedup window before retransmitting a PUT.

    The broker starts a GUID's window when it accepts the PUT, which is after the
    SDK posted it; the retransmit still has to travel, so the SDK stops
    retransmitting a little before the window ends.
    """
    return min(window * 0.1, 2.0)


class LinkState(enum.Enum):
    """Where the engine is in the life of its current connection."""

    DISCONNECTED = "disconnected"
    HANDSHAKING = "handshaking"
    RESTORING = "restoring"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


class QueueState(enum.Enum):
    """Where one queue handle is in its life."""

    OPENING = "opening"  # first open not answered yet
    OPEN = "open"  # opened at least once and not closed (whatever the link)
    REOPENING = "reopening"  # reopen in flight after a reconnect
    CLOSING = "closing"  # close in flight
    ABANDONED = "abandoned"  # the application stopped waiting for its first open
    CLOSED = "closed"


_WRITABLE_STATES = (QueueState.OPEN, QueueState.REOPENING)

_SUCCESS = AckStatus.SUCCESS
_NO_GUID = uuid.UUID(int=0)
_STATUS_OK = pb.STATUS_OK


@dataclass(eq=False, slots=True)
class QueueRecord:
    """The engine's view of one queue handle."""

    queue_id: int
    uri: str
    read: bool
    write: bool
    options: QueueOptions
    on_message: Callable[[Message], Any] | None
    on_ack: Callable[[Ack], Any] | None
    state: QueueState = QueueState.OPENING
    ever_opened: bool = False
    waiters: list[int] = field(default_factory=list)
    """Request ids that the queue's next (re)open answer completes."""


PendingPut = tuple[
    bytes, int, bytes, dict[str, str] | None, Callable[[Ack], Any] | None, float, int
]
"""A PUT buffered until it is ACKed: ``(guid, queue_id, payload, properties, on_ack,
posted_at, size)``, read with the index constants below.

A plain tuple on purpose: a producer may buffer a million PUTs, and the garbage
collector stops tracking a tuple that holds only bytes, strings, numbers, None
and str-to-str dicts, so full collections do not walk them (a class instance with
``__slots__`` is always tracked; at 100k posts/s those walks took ~15% of the CPU).
It names its queue by id for the same reason: the record holds callables.
"""

GUID: Final = 0
QUEUE_ID: Final = 1
PAYLOAD: Final = 2
PROPERTIES: Final = 3
ON_ACK: Final = 4
POSTED_AT: Final = 5
SIZE: Final = 6


@dataclass(frozen=True, slots=True)
class ConfirmItem:
    """A CONFIRM waiting to be encoded."""

    queue_id: int
    guid: bytes


OutboundItem = PendingPut | ConfirmItem | pb.ClientFrame


@dataclass(slots=True)
class _InFlight:
    kind: str  # "open" | "configure" | "close"
    queue: QueueRecord
    resolves: list[int]
    reopen: bool = False


Callback = tuple[Callable[[Any], Any], Any]

WireAck = tuple[bytes, "pb.Status"]
"""A PUT's outcome in ``wire_acks`` mode: its GUID and a ``pb.Status`` value."""


class SessionEngine:
    """The client session state machine. Not thread-safe: the shell serialises calls.

    With ``wire_acks`` (the proxy, which relays outcomes to its own clients) PUT
    outcomes are not ``Ack`` callbacks: ``take_wire_acks()`` hands them over as
    ``(GUID bytes, wire status)`` pairs, in the order they were decided, and no
    ``on_ack`` is called. Same rules, without a ``UUID`` and an ``Ack`` per message.
    """

    def __init__(
        self,
        *,
        client_id: str,
        on_event: Callable[[ev.SessionEvent], Any],
        confirmer: Callable[[Message], None],
        client_name: str = "",
        high_watermark_bytes: int = 64 * 1024 * 1024,
        max_disconnected_buffer_bytes: int | None = None,
        wire_acks: bool = False,
    ) -> None:
        self.client_id = client_id
        self._client_name = client_name
        self._on_event = on_event
        self._confirmer = confirmer
        self._high_watermark = high_watermark_bytes
        self._disconnected_limit = max_disconnected_buffer_bytes

        self.state = LinkState.DISCONNECTED
        self.limits: Limits = DEFAULT_LIMITS
        """What the broker announced in its HelloReply (the defaults until then)."""
        self.broker_id = ""
        """The ``broker_id`` of the last HelloReply."""
        self.generation = 0
        """Counts connections; frames and deliveries of older connections are stale."""
        self.failure: HoldfastError | None = None
        self._address = ""
        self._has_connected = False
        self._reconnecting = False
        """This connection follows a loss: its restore ends with StateRestored."""

        self._queues: dict[int, QueueRecord] = {}
        self._next_queue_id = 1
        self._next_request_id = 1
        self._inflight: dict[int, _InFlight] = {}
        self._restoring: set[int] = set()

        self._pending: dict[bytes, PendingPut] = {}
        self._guids = Uuid7Source()
        self._pending_bytes = 0
        self._outbound: deque[OutboundItem] = deque()
        self._queued_bytes = 0
        self._transport_bytes = 0

        self._callbacks: list[Callback] = []
        self._wire_acks: list[WireAck] | None = [] if wire_acks else None
        self._completions: list[tuple[int, HoldfastError | None]] = []
        self.stale_acks = 0
        """ACKs for GUIDs no longer pending (for example, duplicates); ignored."""

    # ------------------------------------------------------------------ queries

    @property
    def pending_count(self) -> int:
        """PUTs posted and not yet reported (ACKed, failed or UNKNOWN)."""
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Payload and property bytes of the pending PUTs."""
        return self._pending_bytes

    def is_pending(self, guid: uuid.UUID) -> bool:
        """True while a PUT with this GUID waits for its ACK."""
        return guid.bytes in self._pending

    @property
    def connected(self) -> bool:
        """True once the broker answered Hello on the current connection."""
        return self.state in (LinkState.RESTORING, LinkState.ACTIVE)

    @property
    def ever_connected(self) -> bool:
        """True once any broker has answered Hello (``limits`` are then its announcement)."""
        return self._has_connected

    @property
    def has_outbound(self) -> bool:
        """True when ``take_outbound()`` has something to give."""
        return bool(self._outbound)

    def over_high_watermark(self) -> bool:
        """True when bytes not yet taken by the live transport are at or over the watermark.

        Only a live link pushes back: while disconnected, PUTs are buffered
        without waiting (rule 2), bounded only by ``max_disconnected_buffer_bytes``.
        """
        return (
            self.state is not LinkState.DISCONNECTED
            and self._queued_bytes + self._transport_bytes >= self._high_watermark
        )

    def admit_post(self, waiting_since: float, now: float) -> float:
        """Rule 7: may a PUT be posted now? 0.0 if so, else how long to wait for a drain
        before asking again; ``BandwidthLimitError`` once the caller has waited 5 s
        (since ``waiting_since``)."""
        if not self.over_high_watermark():
            return 0.0
        waited = now - waiting_since
        if waited >= HIGH_WATERMARK_WAIT:
            raise BandwidthLimitError(
                f"the outbound buffer stayed over its high watermark "
                f"({self._high_watermark} bytes) for {HIGH_WATERMARK_WAIT:.0f} s; "
                "the message was not taken"
            )
        return HIGH_WATERMARK_WAIT - waited

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called (monotonic seconds), None if no timer runs."""
        return None

    def tick(self, now: float) -> None:
        """Run the timers due at ``now`` (none yet: every rule is driven by frames)."""

    def queue(self, queue_id: int) -> QueueRecord | None:
        """The record of a queue handle, if the engine still knows it."""
        return self._queues.get(queue_id)

    # ------------------------------------------------------------------ outputs

    def take_outbound(self) -> list[OutboundItem]:
        """Hand the shell everything queued for the wire, in order.

        Its bytes now count as taken by the transport until ``transport_drained``.
        """
        items = list(self._outbound)
        self._outbound.clear()
        self._transport_bytes += self._queued_bytes
        self._queued_bytes = 0
        return items

    def take_callbacks(self) -> list[Callback]:
        """Callbacks for the application, in the order they must run."""
        callbacks, self._callbacks = self._callbacks, []
        return callbacks

    def take_wire_acks(self) -> list[WireAck]:
        """PUT outcomes as ``(GUID bytes, wire status)``, in order (``wire_acks`` mode)."""
        acks = self._wire_acks
        if not acks:
            return []
        self._wire_acks = []
        return acks

    def take_completions(self) -> list[tuple[int, HoldfastError | None]]:
        """Open/configure/close requests that completed, with their error if they failed."""
        done, self._completions = self._completions, []
        return done

    # ------------------------------------------------------------------ link inputs

    def connection_made(self, address: str) -> int:
        """A transport is up: queue the Hello and return this connection's generation."""
        self._check_usable()
        self.generation += 1
        self.state = LinkState.HANDSHAKING
        self._address = address
        self._queue_frame(
            pb.ClientFrame(
                hello=pb.Hello(
                    protocol_version=PROTOCOL_VERSION,
                    client_id=self.client_id,
                    client_name=self._client_name,
                )
            )
        )
        return self.generation

    def transport_drained(self, nbytes: int) -> None:
        """The transport has taken ``nbytes`` previously handed out by ``take_outbound``."""
        self._transport_bytes = max(0, self._transport_bytes - nbytes)

    def connection_lost(self, generation: int, reason: str) -> None:
        """The connection of ``generation`` is gone. Buffer everything until the next one."""
        if generation != self.generation or self.state in (
            LinkState.DISCONNECTED,
            LinkState.CLOSED,
            LinkState.FAILED,
        ):
            return
        was_up = self.connected
        self.state = LinkState.DISCONNECTED
        self._outbound.clear()  # unsent CONFIRMs are dropped; PUTs stay in _pending
        self._queued_bytes = self._transport_bytes = 0
        self._restoring.clear()
        inflight, self._inflight = self._inflight, {}
        for request in inflight.values():
            queue = request.queue
            if request.kind == "close":
                # Rule 6: a close that cannot reach the broker completes locally.
                self._close_locally(queue)
                self._complete(request.resolves, None)
            elif queue.state is QueueState.ABANDONED:
                self._forget(queue)
            else:
                # Rule 4: pending open/configure are re-sent by the next reopen.
                queue.waiters[:0] = request.resolves
                if queue.state is QueueState.REOPENING:
                    queue.state = QueueState.OPEN
        if was_up:
            self._emit(ev.ConnectionLost(self._address, reason))

    def frame_received(self, generation: int, frame: pb.ServerFrame, now: float) -> None:
        """Process one frame from the broker on the connection of ``generation``."""
        if generation != self.generation or self.state in (
            LinkState.DISCONNECTED,
            LinkState.CLOSED,
            LinkState.FAILED,
        ):
            return
        kind = frame.WhichOneof("frame")
        if kind == "acks":
            self._on_acks(frame.acks)
        elif kind == "pushes":
            self._on_pushes(frame.pushes)
        elif kind == "response":
            self._on_response(frame.response, now)
        elif kind == "hello_reply":
            self._on_hello_reply(frame.hello_reply, now)
        elif kind == "error":
            self._on_error(frame.error)
        else:
            log.warning("ignoring a server frame of unknown kind %r", kind)

    # ------------------------------------------------------------------ application inputs

    def open_queue(
        self,
        uri: str,
        *,
        read: bool,
        write: bool,
        options: QueueOptions,
        on_message: Callable[[Message], Any] | None,
        on_ack: Callable[[Ack], Any] | None,
    ) -> tuple[QueueRecord, int]:
        """Start opening a queue; return its record and the request id to wait on."""
        self._check_usable()
        try:
            parse_queue_uri(uri)
        except Invalid as error:
            raise invalid_error(error) from None
        if not (read or write):
            raise InvalidArgumentError("open a queue with read=True, write=True or both")
        if read and on_message is None:
            raise InvalidArgumentError("a queue opened with read=True needs on_message")
        queue = QueueRecord(
            queue_id=self._next_queue_id,
            uri=uri,
            read=read,
            write=write,
            options=options,
            on_message=on_message,
            on_ack=on_ack,
        )
        self._next_queue_id += 1
        self._queues[queue.queue_id] = queue
        request_id = self._new_request_id()
        if self.connected:
            self._send_open(queue, [request_id], reopen=False)
        else:
            queue.waiters.append(request_id)  # sent by the next connection's reopen pass
        return queue, request_id

    def configure_queue(self, queue_id: int, options: QueueOptions) -> int:
        """Change a queue's options; return the request id to wait on.

        The options are remembered at once, so a reconnect reopens the queue with
        them even if this request was still pending when the link dropped.
        """
        self._check_usable()
        queue = self._live_queue(queue_id)
        queue.options = options
        request_id = self._new_request_id()
        if self.connected:
            self._inflight[request_id] = _InFlight("configure", queue, [request_id])
            self._queue_frame(
                pb.ClientFrame(
                    configure_queue=pb.ConfigureQueue(
                        request_id=request_id,
                        queue_id=queue.queue_id,
                        options=_wire_options(options),
                    )
                )
            )
        else:
            queue.waiters.append(request_id)
        return request_id

    def close_queue(self, queue_id: int) -> int | None:
        """Close a queue. Return a request id to wait on, or None if it closed locally."""
        self._check_usable()
        queue = self._live_queue(queue_id)
        if queue.state is QueueState.OPENING:
            # The broker may still open it: undo that when it answers, as for a timeout.
            self.abandon_open(queue_id)
            return None
        if not self.connected:
            self._close_locally(queue)
            return None
        request_id = self._new_request_id()
        queue.state = QueueState.CLOSING
        self._inflight[request_id] = _InFlight("close", queue, [request_id])
        self._queue_frame(
            pb.ClientFrame(close_queue=pb.CloseQueue(request_id=request_id, queue_id=queue_id))
        )
        return request_id

    def abandon_open(self, queue_id: int) -> None:
        """Give up a queue's first open (timed out, or closed before it completed).

        Whoever still waits for it is told the queue is not open; if the open is
        already on the wire, the queue is closed again when the broker opens it.
        """
        queue = self._queues.get(queue_id)
        if queue is None or queue.state is not QueueState.OPENING:
            return
        gone = QueueNotOpenError(f"queue {queue.uri} was given up before it opened")
        self._complete(queue.waiters, gone)
        queue.waiters = []
        inflight = [r for r in self._inflight.values() if r.queue is queue]
        for request in inflight:
            self._complete(request.resolves, gone)
            request.resolves = []
        if inflight:
            queue.state = QueueState.ABANDONED  # closed if the broker says it opened
        else:
            queue.state = QueueState.CLOSED
            del self._queues[queue_id]

    def post(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        now: float,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Buffer a PUT under a new uuid7 GUID (and send it if the link is ACTIVE).

        ``guid`` replaces the new GUID for producers that must be idempotent
        across processes (a proxy forwarding its clients' GUIDs, a Spark task
        retried elsewhere): the caller promises it names this message only.
        """
        if guid is None:
            return self._buffer(queue_id, payload, properties, on_ack, now, None)
        key = guid.bytes
        if key in self._pending:
            raise InvalidArgumentError(f"GUID {guid} is already pending on this session")
        self._buffer(queue_id, payload, properties, on_ack, now, key)
        return guid

    def relay(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        guid: bytes,
        now: float,
    ) -> bool:
        """``post()`` under a GUID given as its 16 bytes, for a proxy relaying its
        clients' PUTs (no ``UUID`` is made; outcomes go by ``wire_acks``). Returns False,
        buffering nothing, when that GUID is already pending: a client retransmitting a
        PUT that is still in flight here."""
        if guid in self._pending:
            return False
        if len(guid) != 16:
            raise InvalidArgumentError(f"a GUID is 16 bytes, not {len(guid)}")
        self._buffer(queue_id, payload, properties, None, now, guid)
        return True

    def _buffer(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        now: float,
        key: bytes | None,
    ) -> uuid.UUID:
        """Check and buffer one PUT under ``key``, or under a new GUID if None; return
        the new GUID (a dummy when ``key`` was given, which callers ignore)."""
        # The hot path of every producer (and of the proxy, once per client PUT):
        # locals instead of repeated attribute lookups, each check done once.
        state = self.state
        if state is LinkState.CLOSED or state is LinkState.FAILED:
            self._check_usable()
        queue = self._queues.get(queue_id)
        if queue is None or queue.state not in _WRITABLE_STATES:
            raise QueueNotOpenError(f"queue {queue.uri if queue else queue_id} is not open")
        if not queue.write:
            raise NotWritableError(f"queue {queue.uri} was opened without write=True")
        if not isinstance(payload, bytes):
            if not isinstance(payload, bytearray | memoryview):
                raise InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
            payload = bytes(payload)
        limits = self.limits
        props: dict[str, str] | None = None
        try:
            check_payload(payload, limits)
            size = len(payload) + PUT_OVERHEAD
            if properties:
                props, props_size = check_properties(properties, limits)
                # Buffer accounting, not the limit: each property's tags and lengths.
                size += props_size + 4 * len(props)
        except Invalid as error:
            raise invalid_error(error) from None
        active = state is LinkState.ACTIVE
        if (
            self._disconnected_limit is not None
            and not active
            and self._pending_bytes + size > self._disconnected_limit
        ):
            raise BufferFullError(
                f"{self._pending_bytes} bytes are buffered while disconnected; this PUT "
                f"would exceed max_disconnected_buffer_bytes={self._disconnected_limit}"
            )
        made = _NO_GUID
        if key is None:
            made, key = self._guids.next()
        put: PendingPut = (key, queue_id, payload, props, on_ack, now, size)
        self._pending[key] = put
        self._pending_bytes += size
        if active:
            self._outbound.append(put)
            self._queued_bytes += size
        return made

    def confirm(self, message: Message) -> None:
        """Queue a CONFIRM; rule 5: never buffered across a connection loss."""
        self._check_usable()
        if not self.connected or message._generation != self.generation:
            raise ConfirmDroppedError(
                f"CONFIRM of {message.guid} dropped: "
                + (
                    "the link is down"
                    if not self.connected
                    else "it was delivered on an earlier connection"
                )
                + "; the broker will redeliver the message"
            )
        queue = self._queues.get(message._queue_id)
        if queue is None or queue.state not in _WRITABLE_STATES:
            raise QueueNotOpenError(f"queue {message.queue_uri} is not open")
        self._outbound.append(ConfirmItem(queue.queue_id, message.guid.bytes))
        self._queued_bytes += 24

    def emit(self, event: ev.SessionEvent) -> None:
        """Report an event the shell observed (such as a failed connection attempt)
        through the same ordered channel as the engine's own events."""
        self._emit(event)

    def fail(self, error: HoldfastError) -> None:
        """A terminal error: stop for good, report pending PUTs UNKNOWN, fail waiters."""
        if self.state not in (LinkState.CLOSED, LinkState.FAILED):
            self._fail(error)

    def close(self) -> None:
        """Close the session: every PUT still pending is reported UNKNOWN."""
        if self.state is LinkState.CLOSED:
            return
        unknown = len(self._pending)
        self._end(SessionClosedError("the session is closed"))
        self.state = LinkState.CLOSED
        self._emit(ev.SessionClosed(unknown))

    # ------------------------------------------------------------------ frame handlers

    def _on_hello_reply(self, reply: pb.HelloReply, now: float) -> None:
        if self.state is not LinkState.HANDSHAKING:
            log.warning("ignoring an unexpected HelloReply")
            return
        if reply.protocol_version != PROTOCOL_VERSION:
            self._fail(
                ProtocolVersionError(
                    f"broker speaks protocol {reply.protocol_version}, "
                    f"this SDK speaks {PROTOCOL_VERSION}"
                )
            )
            return
        try:
            self.limits = limits_from_hello(reply)
        except ValueError as error:
            self._fail(TerminalTransportError(f"the broker announced unusable limits: {error}"))
            return
        self.broker_id = reply.broker_id
        self.state = LinkState.RESTORING
        self._reconnecting = self._has_connected
        if self._has_connected:
            self._emit(ev.Reconnected(self._address, reply.broker_id))
        else:
            self._has_connected = True
            self._emit(ev.Connected(self._address, reply.broker_id))
        # Rule 4, step 1: reopen in the order the queues were opened.
        for queue in list(self._queues.values()):
            if queue.state in (QueueState.OPEN, QueueState.OPENING):
                waiters, queue.waiters = queue.waiters, []
                self._send_open(queue, waiters, reopen=queue.ever_opened)
                self._restoring.add(queue.queue_id)
        if not self._restoring:
            self._finish_restore(now)

    def _on_response(self, response: pb.Response, now: float) -> None:
        request = self._inflight.pop(response.request_id, None)
        if request is None:
            log.warning("ignoring a response to unknown request %d", response.request_id)
            return
        queue = request.queue
        # Read before the answer is handled: a refused (re)open forgets the queue,
        # which takes it out of ``_restoring`` too, and the restore must still finish.
        restoring = request.kind == "open" and queue.queue_id in self._restoring
        error: HoldfastError | None = None
        if response.status != pb.STATUS_OK:
            error = request_error(response.status, response.message)
        if request.kind == "open":
            self._on_open_answered(queue, request, error)
        elif request.kind == "close":
            self._close_locally(queue)
        self._complete(request.resolves, error)
        if restoring:
            self._restoring.discard(queue.queue_id)
            if not self._restoring and self.state is LinkState.RESTORING:
                self._finish_restore(now)

    def _on_open_answered(
        self, queue: QueueRecord, request: _InFlight, error: HoldfastError | None
    ) -> None:
        if queue.state is QueueState.ABANDONED:
            if error is None:  # the application gave up; undo the open
                self._send_close_quietly(queue)
            else:
                self._forget(queue)
            return
        if error is not None:
            if request.reopen:
                self._emit(ev.QueueReopened(queue.uri, str(error)))
            self._close_locally(queue)
            return
        if queue.state in (QueueState.OPENING, QueueState.REOPENING):
            queue.state = QueueState.OPEN
            queue.ever_opened = True
        if request.reopen:
            self._emit(ev.QueueReopened(queue.uri))

    def _finish_restore(self, now: float) -> None:
        """Rule 4, steps 2 and 3: retransmit pending PUTs in post order, then report."""
        window = self.limits.dedup_window
        horizon = now - window + _retransmit_margin(window)
        retransmitted = expired = 0
        queues = self._queues
        for put in list(self._pending.values()):
            if put[POSTED_AT] <= horizon:
                # The broker may have forgotten this GUID: a retransmit could duplicate it.
                self._report(put, AckStatus.UNKNOWN)
                expired += 1
            elif (queue := queues.get(put[QUEUE_ID])) and queue.state is QueueState.CLOSING:
                continue  # reported UNKNOWN when its close completes; sending it is waste
            else:
                self._outbound.append(put)
                self._queued_bytes += put[SIZE]
                retransmitted += 1
        self.state = LinkState.ACTIVE
        if self._reconnecting:  # every Reconnected is followed by one StateRestored
            self._emit(ev.StateRestored(retransmitted, expired))

    def _on_acks(self, batch: pb.AckBatch) -> None:
        # One iteration per ACKed message: locals, and the Ack's UUID built from the
        # pending GUID's 16 bytes without uuid.UUID's argument checks.
        pending = self._pending
        released = 0
        wire_acks = self._wire_acks
        if wire_acks is not None:
            relay = wire_acks.append
            for ack in batch.acks:
                guid = ack.guid
                put = pending.pop(guid, None)
                if put is None:
                    self.stale_acks += 1
                    continue
                released += put[SIZE]
                relay((guid, ack.status))
            self._pending_bytes -= released
            return
        queues = self._queues
        append = self._callbacks.append
        for ack in batch.acks:
            put = pending.pop(ack.guid, None)
            if put is None:
                self.stale_acks += 1
                continue
            released += put[SIZE]
            # A queue leaves ``_queues`` only once its pending PUTs are reported.
            queue = queues[put[QUEUE_ID]]
            callback = put[ON_ACK]
            if callback is None:
                callback = queue.on_ack
            if callback is not None:
                wire = ack.status
                status = _SUCCESS if wire == _STATUS_OK else ack_status(wire)
                append((callback, Ack(uuid_from_bytes(put[GUID]), status, queue.uri)))
        self._pending_bytes -= released

    def _on_pushes(self, batch: pb.PushBatch) -> None:
        queues = self._queues
        generation = self.generation
        for push in batch.pushes:
            queue = queues.get(push.queue_id)
            if queue is None or queue.on_message is None or queue.state not in _WRITABLE_STATES:
                continue  # closed meanwhile: the broker redelivers it elsewhere
            guid = push.guid
            message = Message(
                # The broker sends 16-byte GUIDs; anything else fails as UUID() fails.
                uuid_from_bytes(guid) if len(guid) == 16 else uuid.UUID(bytes=guid),
                push.payload,
                dict(push.properties),
                push.delivery_count,
                queue.uri,
                self._confirmer,
                queue.queue_id,
                generation,
            )
            self._callbacks.append((queue.on_message, message))

    def _on_error(self, error: pb.Error) -> None:
        name = status_name(error.status)
        if error.status == pb.STATUS_VERSION_MISMATCH:
            self._fail(ProtocolVersionError(error.message or "protocol version mismatch"))
            return
        queue = self._queues.get(error.queue_id)
        if error.status == pb.STATUS_UNKNOWN_GUID and queue is not None:
            guids = tuple(uuid.UUID(bytes=g) for g in error.guids if len(g) == 16)
            self._emit(ev.ConfirmRejected(queue.uri, guids, name))
            return
        # The broker ends the stream after a fatal error; the shell sees it end.
        log.warning("broker reported %s: %s (fatal=%s)", name, error.message, error.fatal)

    # ------------------------------------------------------------------ helpers

    def _check_usable(self) -> None:
        if self.state is LinkState.CLOSED:
            raise SessionClosedError("the session is closed")
        if self.state is LinkState.FAILED:
            raise SessionClosedError(f"the session failed: {self.failure}") from self.failure

    def _live_queue(self, queue_id: int) -> QueueRecord:
        queue = self._queues.get(queue_id)
        if queue is None or queue.state in (
            QueueState.CLOSED,
            QueueState.CLOSING,
            QueueState.ABANDONED,
        ):
            raise QueueNotOpenError(f"queue handle {queue_id} is not open")
        return queue

    def _new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def _queue_frame(self, frame: pb.ClientFrame) -> None:
        self._outbound.append(frame)
        self._queued_bytes += 64

    def _send_open(self, queue: QueueRecord, resolves: list[int], *, reopen: bool) -> None:
        request_id = self._new_request_id()
        if reopen:
            queue.state = QueueState.REOPENING
        self._inflight[request_id] = _InFlight("open", queue, resolves, reopen)
        self._queue_frame(
            pb.ClientFrame(
                open_queue=pb.OpenQueue(
                    request_id=request_id,
                    queue_id=queue.queue_id,
                    uri=queue.uri,
                    read=queue.read,
                    write=queue.write,
                    options=_wire_options(queue.options),
                )
            )
        )

    def _send_close_quietly(self, queue: QueueRecord) -> None:
        request_id = self._new_request_id()
        queue.state = QueueState.CLOSING
        self._inflight[request_id] = _InFlight("close", queue, [])
        self._queue_frame(
            pb.ClientFrame(
                close_queue=pb.CloseQueue(request_id=request_id, queue_id=queue.queue_id)
            )
        )

    def _close_locally(self, queue: QueueRecord) -> None:
        """Mark a queue closed; its pending PUTs are reported UNKNOWN (rule 6)."""
        queue_id = queue.queue_id
        for put in [p for p in self._pending.values() if p[QUEUE_ID] == queue_id]:
            self._report(put, AckStatus.UNKNOWN)
        self._forget(queue)
        self._complete(queue.waiters, QueueNotOpenError(f"queue {queue.uri} was closed"))
        queue.waiters = []

    def _forget(self, queue: QueueRecord) -> None:
        queue.state = QueueState.CLOSED
        self._queues.pop(queue.queue_id, None)
        self._restoring.discard(queue.queue_id)

    def _report(self, put: PendingPut, status: AckStatus) -> None:
        """Remove a PUT from the buffer and report it once (its queue is still known)."""
        if self._pending.pop(put[GUID], None) is None:
            return
        self._pending_bytes -= put[SIZE]
        if self._wire_acks is not None:
            self._wire_acks.append((put[GUID], wire_status_of(status)))
            return
        queue = self._queues[put[QUEUE_ID]]
        callback = put[ON_ACK]
        if callback is None:
            callback = queue.on_ack
        if callback is not None:
            self._callbacks.append((callback, Ack(uuid_from_bytes(put[GUID]), status, queue.uri)))

    def _complete(self, request_ids: list[int], error: HoldfastError | None) -> None:
        self._completions.extend((rid, error) for rid in request_ids)

    def _emit(self, event: ev.SessionEvent) -> None:
        self._callbacks.append((self._on_event, event))

    def _end(self, error: HoldfastError) -> None:
        """Stop for good: report every pending PUT UNKNOWN and fail every waiter."""
        for put in list(self._pending.values()):
            self._report(put, AckStatus.UNKNOWN)
        for queue in list(self._queues.values()):
            self._complete(queue.waiters, error)
            queue.waiters = []
            self._forget(queue)
        for request in self._inflight.values():
            self._complete(request.resolves, error)
        self._inflight.clear()
        self._outbound.clear()
        self._queued_bytes = self._transport_bytes = 0

    def _fail(self, error: HoldfastError) -> None:
        self.failure = error
        self._end(error)
        self.state = LinkState.FAILED
        self._emit(ev.SessionFailed(str(error)))


def _wire_options(options: QueueOptions) -> pb.QueueOptions:
    return pb.QueueOptions(
        max_unconfirmed_messages=options.max_unconfirmed_messages,
        max_unconfirmed_bytes=options.max_unconfirmed_bytes,
    )

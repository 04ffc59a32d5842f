"""The HA session engine: every client-HA rule of the Holdfast contract, in one place.

No sockets, no threads, no clock of its own (like ``h11``): it takes inputs and
produces outputs, and a shell (the driver of the SDK's ``Session`` and of the proxy's
upstream link) moves them; tests drive it with scripted frames. It is split by job:
``state`` (the link and queue state machines, as tables), ``connection`` (one
connection's life: Hello, HelloReply, the restore's sequence, the loss), ``restore``
(rule 4's steps), ``putbuffer`` (pending PUTs, packed by ``putsegments``; their age,
push-back), ``producer`` (rules 1, 2 and 7 on the post path), ``consumer`` (rule 5 on
the CONFIRM path), ``outbound`` (what waits for the wire), ``queue_table`` (queue
handles and their requests), ``outcomes`` (ACKs, PUSHes and events for the
application), ``discovery`` (``count_consumers``, re-asked after a reconnect); this
module is the facade that routes inputs to them and ends the session.

Inputs are application calls, link events (``connection_made``, ``frame_received``,
``connection_lost``, ``transport_drained``) and time (each input that depends on it
takes ``now``, monotonic seconds; ``tick(now)`` once ``now >= next_deadline()``).
Outputs are taken by the shell: ``take_outbound`` (items for ``frames.encode``),
``take_callbacks`` (ACKs, messages and events, in order), ``take_wire_acks`` (PUT
outcomes in ``wire_acks`` mode) and ``take_completions`` (answered requests).

The rules (``docs/contract.md``, whose last table says where each lives): 1
``post`` gives a uuid7; 2 the ``PutBuffer`` keeps every PUT until reported; 3
``Outcomes.acks`` reports each once (``HISTORY_FULL`` is retried by ``tick``); 4
``restore``: reopen in open order, then retransmit in post order, PUTs past the
window reported UNKNOWN; 5 ``Consumer.confirm_wire`` refuses a stale or disconnected
CONFIRM; 6 ``QueueTable.close_locally``; 7 ``admit_post``; a PUT's age travels (``relay``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from holdfast.proto import pb
from holdfast.proto.limits import Limits
from holdfast.sdk import events as ev
from holdfast.sdk.connection import Connection
from holdfast.sdk.consumer import Consumer
from holdfast.sdk.discovery import ConsumerQueries
from holdfast.sdk.errors import (
    HoldfastError,
    RemoteProtocolError,
    SessionClosedError,
    TerminalTransportError,
)
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.outbound import ConfirmItem, Outbound, OutboundItem
from holdfast.sdk.outcomes import Outcomes, WireAck, WirePushes
from holdfast.sdk.producer import HIGH_WATERMARK_WAIT, Producer
from holdfast.sdk.putbuffer import PUT_OVERHEAD, PutBuffer
from holdfast.sdk.queue_table import QueueRecord, QueueTable
from holdfast.sdk.relaying import Relayer
from holdfast.sdk.state import LinkEvent, LinkMachine, LinkState, QueueState
from holdfast.sdk.stats import SessionStats, StatsCounters
from holdfast.sdk.types import Ack, AckStatus, Message, Settler


class SessionEngine:
    """The client session state machine. Not thread-safe: the shell serialises calls.

    With ``wire_acks`` (the proxy, which relays outcomes to its own clients, and says
    so in Hello) PUT outcomes are not ``Ack`` callbacks: ``take_wire_acks()`` hands
    them over as ``(GUID bytes, wire status)`` pairs, in the order they were decided.
    With ``wire_pushes`` a queue's ``on_message`` gets a frame's PUSHes by runs of one
    queue as ``WirePushes`` (the PUSHes as read and their connection generation),
    settled by ``confirm_wire`` or ``confirm_run``. A broker's refusal (another protocol
    version, a refused token) fails the session; with ``retry_refusals`` (the proxy's:
    its broker may be upgraded, its next address take it) it ends the connection only.
    """

    def __init__(
        self,
        *,
        client_id: str,
        on_event: Callable[[ev.SessionEvent], Any],
        confirmer: Settler,
        client_name: str = "",
        high_watermark_bytes: int = 64 * 1024 * 1024,
        max_disconnected_buffer_bytes: int | None = None,
        wire_acks: bool = False,
        wire_pushes: bool = False,
        retry_refusals: bool = False,
    ) -> None:
        self.client_id = client_id
        self.retry_refusals = retry_refusals
        self._confirmer = confirmer
        self._link = LinkMachine()
        self.failure: HoldfastError | None = None
        """The error the session failed with (``SessionFailed``), if it did."""
        self._puts = PutBuffer(keyed=wire_acks)  # a proxy's: its clients' GUIDs interleave
        self._outbound = Outbound(high_watermark_bytes)
        self._queues = QueueTable(self._outbound.add_frame, self._report_queue_unknown)
        self._counters = StatsCounters()
        self._out = Outcomes(
            self._puts,
            self._queues,
            on_event,
            wire_acks=wire_acks,
            wire_pushes=wire_pushes,
            counters=self._counters,
        )
        parts = (self._link, self._puts, self._queues, self._outbound, self._counters)
        self._producer = Producer(*parts, self._check_usable, max_disconnected_buffer_bytes)
        # The post path is bound straight to the producer (and relayer): a call less.
        self.admit_post = self._producer.admit_post
        """Rule 7: 0.0 if a post may go ahead, else seconds to wait (see ``Producer``)."""
        self.post = self._producer.post
        """Buffer a PUT under a new uuid7 GUID, or ``guid`` (see ``Producer.post``)."""
        self.buffer = self._producer.buffer
        """``post`` without ``guid``, a call less: the shells' hot path (``Producer.buffer``)."""
        self.post_many = self._producer.post_many
        """Buffer a batch of PUTs of one queue, all or none (see ``Producer.post_many``)."""
        self.relay = (relayer := Relayer(self._producer, self._puts, self._outbound)).relay
        """Buffer a client's PUT under its GUID, as old as it arrived (``Relayer.relay``)."""
        self.relay_run = relayer.relay_run
        """``relay`` for a run of PUTs of one queue, in one loop (``Relayer.relay_run``)."""
        self.over_high_watermark = self._producer.over_high_watermark
        """True when a live link has at least the high watermark of bytes unsent."""
        self.note_admission_wait = self._producer.note_admission_wait
        """Count a post the shell makes wait, by why (``Producer.note_admission_wait``)."""
        self.tick = self._producer.retry_due
        """Time passed: retransmit pushed-back PUTs whose back-off is due (``retry_due``)."""
        # The outputs, bound straight to where they wait (the shells take them per pump).
        self.take_outbound = self._outbound.take
        """Everything queued for the wire, in order, in the transport till ``transport_drained``."""
        self.transport_drained = self._outbound.drained
        """The transport has taken ``nbytes`` previously handed out by ``take_outbound``."""
        self.take_callbacks = self._out.take_callbacks
        """Callbacks for the application (ACKs, messages, events), in the order they run."""
        self.take_wire_acks = self._out.take_wire_acks
        """PUT outcomes as ``(GUID bytes, wire status)``, in order (``wire_acks`` mode)."""
        self.take_completions = self._queues.take_completions
        """Open/configure/close requests that completed, with their error if they failed."""
        self.queries = ConsumerQueries(self._outbound.add_frame, self._queues.complete)
        """Service discovery (``CountConsumers``) requests."""
        self._connection = Connection(
            self._link,
            self._puts,
            self._queues,
            self._outbound,
            self._out,
            self._producer,
            self.queries,
            self._counters,
            client_id,
            client_name,
            wire_acks,
        )
        self._consumer = Consumer(
            self._link,
            self._connection,
            self._queues,
            self._outbound,
            self._counters,
            self._check_usable,
        )
        # Bound straight to the consumer like the post path: one call less per message.
        self.confirm = self._consumer.confirm
        """Queue a CONFIRM (or with ``reject`` a REJECT); rule 5: never buffered across a
        connection loss (``Consumer.confirm``)."""
        self.confirm_wire = self._consumer.confirm_wire
        """``confirm()`` of a PUSH of ``WirePushes``: its queue, GUID and generation."""
        self.confirm_run = self._consumer.confirm_run
        """``confirm_wire`` of many deliveries of one queue, in one item (``Consumer``)."""
        self.begin_closing = self._consumer.begin_closing
        """``close()`` has begun: later CONFIRMs and REJECTs are dropped (rule 5)."""

    @property
    def limits(self) -> Limits:
        """What the broker announced in its HelloReply (the defaults until then)."""
        return self._producer.limits

    # ------------------------------------------------------------------ queries

    @property
    def state(self) -> LinkState:
        """The link's state (``holdfast.sdk.state.LINK_TRANSITIONS``)."""
        return self._link.state

    @property
    def pending_count(self) -> int:
        """PUTs posted and not yet reported (ACKed, failed or UNKNOWN)."""
        return len(self._puts)

    @property
    def stale_acks(self) -> int:
        """ACKs for GUIDs no longer pending (for example, duplicates); ignored."""
        return self._out.stale_acks

    def stats(self) -> SessionStats:
        """A snapshot of the client counters (``holdfast.sdk.stats``)."""
        return self._counters.snapshot(len(self._puts), self._puts.bytes)

    def is_pending(self, guid: uuid.UUID) -> bool:
        """True while a PUT with this GUID waits for its ACK."""
        return guid.bytes in self._puts

    @property
    def connected(self) -> bool:
        """True once the broker answered Hello on the current connection."""
        return self._link.connected

    @property
    def ever_connected(self) -> bool:
        """True once any broker has answered Hello (``limits`` are then its announcement)."""
        return self._connection.ever_connected

    @property
    def generation(self) -> int:
        """Counts connections; frames and deliveries of older connections are stale."""
        return self._connection.generation

    @property
    def broker_id(self) -> str:
        """The ``broker_id`` of the last HelloReply."""
        return self._connection.broker_id

    @property
    def peer_batches(self) -> bool:
        """Whether this connection's server reads ``ClientFrames`` (its HelloReply)."""
        return self._connection.peer_batches

    @property
    def has_outbound(self) -> bool:
        """True when ``take_outbound()`` has something to give."""
        return bool(self._outbound)

    def queue(self, queue_id: int) -> QueueRecord | None:
        """The record of a queue handle, if the engine still knows it."""
        return self._queues.get(queue_id)

    def next_deadline(self) -> float | None:
        """When the engine next needs ``tick`` (None: no timer is running)."""
        return self._puts.retry_at

    # ------------------------------------------------------------------ link inputs

    def connection_made(self, address: str) -> int:
        """A transport is up: queue the Hello and return this connection's generation."""
        self._check_usable()
        return self._connection.made(address)

    def connection_lost(self, generation: int, reason: str) -> None:
        """The connection of ``generation`` is gone. Buffer everything until the next one.

        A loss of an older connection, or one already reported, is ignored."""
        if self._connection.current(generation):
            self._connection.lost(reason)

    def frame_received(self, generation: int, frame: pb.ServerFrame, now: float) -> None:
        """Process one frame from the broker on the connection of ``generation``.

        Frames of a connection already lost are stale and ignored. A frame this SDK
        cannot accept raises ``RemoteProtocolError`` with nothing of it applied: the
        shell then drops the connection."""
        if not self._connection.current(generation):
            return
        state = self._link.state
        kind = frame.WhichOneof("frame")
        if kind == "hello_reply":
            if state is not LinkState.HANDSHAKING:
                raise RemoteProtocolError("the server sent a second HelloReply")
            try:
                self._connection.hello_reply(frame.hello_reply, now)
            except TerminalTransportError as error:
                self._refused(error)
            return
        if state is LinkState.HANDSHAKING and kind != "error":
            what = kind or "an empty frame"
            raise RemoteProtocolError(f"the server sent {what} before HelloReply")
        if kind == "acks":
            self._out.acks(frame.acks, now)
        elif kind == "pushes":
            self._out.pushes(frame.pushes, generation, self._confirmer)
        elif kind == "response":
            self._connection.response(frame.response, now)
        elif kind == "error":
            if (failure := self._out.error_frame(frame.error)) is not None:
                self._refused(failure)
        elif kind == "consumer_count":
            self.queries.answered(frame.consumer_count)
        else:
            raise RemoteProtocolError(f"the server sent a frame of unknown kind {kind!r}")

    # ------------------------------------------------------------------ application inputs

    def open_queue(
        self,
        uri: str,
        *,
        read: bool,
        write: bool,
        options: QueueOptions,
        on_message: Callable[[Message], Any] | Callable[[WirePushes], Any] | None,
        on_ack: Callable[[Ack], Any] | None,
        for_client: str = "",
    ) -> tuple[QueueRecord, int]:
        """Start opening a queue; return its record and the request id to wait on."""
        self._check_usable()
        record = {"read": read, "write": write, "options": options, "for_client": for_client}
        callbacks = {"on_message": on_message, "on_ack": on_ack}
        return self._queues.open(uri, record | callbacks, connected=self.connected)

    def count_consumers(self, uri: str) -> int:
        """Ask how many live consumers ``uri`` has; return the request id to wait on
        (then ``queries.take_answer``). Re-asked after a reconnect until answered."""
        self._check_usable()
        request_id = self._queues.new_request_id()
        self.queries.ask(request_id, uri, self.connected)
        return request_id

    def configure_queue(self, queue_id: int, options: QueueOptions) -> int:
        """Change a queue's options; return the request id to wait on.

        The options are remembered at once, so a reconnect reopens the queue with
        them even if this request was still pending when the link dropped.
        """
        self._check_usable()
        return self._queues.configure(queue_id, options, connected=self.connected)

    def close_queue(self, queue_id: int) -> int | None:
        """Close a queue. Return a request id to wait on, or None if it closed locally
        (rule 6: while disconnected, or before its first open completed)."""
        self._check_usable()
        return self._queues.close(queue_id, connected=self.connected)

    def no_broker(self, reason: str) -> None:
        """The proxy refused the connection, reaching no broker (after ``connection_lost``):
        fail the queues' first opens now, with ``reason`` (``BrokerUnreachableError``);
        the rest waits. Ignored once the session has ended, like a loss."""
        if not self._link.ended:
            self._connection.no_broker(reason)

    def abandon_open(self, queue_id: int) -> None:
        """Give up a queue's first open (timed out, or closed before it completed).

        Whoever still waits for it is told the queue is not open; if the open is
        already on the wire, the queue is closed again when the broker opens it.
        """
        queue = self._queues.get(queue_id)
        if queue is not None and queue.state is QueueState.OPENING:
            self._queues.abandon(queue)

    def emit(self, event: ev.SessionEvent) -> None:
        """Report an event the shell observed (such as a failed connection attempt)
        through the same ordered channel as the engine's own events."""
        self._out.emit(event)

    def fail(self, error: HoldfastError) -> None:
        """A terminal error: stop for good, report pending PUTs UNKNOWN, fail waiters."""
        if not self._link.ended:
            self._fail(error)

    def close(self) -> None:
        """Close the session: every PUT still pending is reported UNKNOWN."""
        if self._link.state is LinkState.CLOSED:
            return
        unknown = len(self._puts)
        self._end(SessionClosedError("the session is closed"))
        self._link.apply(LinkEvent.CLOSE)
        self._out.emit(ev.SessionClosed(unknown))

    def _check_usable(self) -> None:
        state = self._link.state
        if state is LinkState.CLOSED or state is LinkState.FAILED:
            raise SessionClosedError.of(self.failure if state is LinkState.FAILED else None)

    def _report_queue_unknown(self, queue: QueueRecord) -> None:
        self._puts.busy.discard(queue.queue_id)
        for put in self._puts.of_queue(queue.queue_id):
            self._out.report(put, AckStatus.UNKNOWN)

    def _end(self, error: HoldfastError) -> None:
        """Stop for good: report every pending PUT UNKNOWN and fail every waiter."""
        for put in self._puts:
            self._out.report(put, AckStatus.UNKNOWN)
        self._queues.end(error, SessionClosedError.of(self.failure))
        self.queries.end(error)
        self._outbound.clear()

    def _refused(self, error: HoldfastError) -> None:
        """A broker this session cannot use: fail, or end the connection (``retry_refusals``)."""
        if self.retry_refusals:
            raise error
        self._fail(error)

    def _fail(self, error: HoldfastError) -> None:
        self.failure = error
        self._end(error)
        self._link.apply(LinkEvent.FAIL)
        self._out.emit(ev.SessionFailed(str(error)))


# Re-exported: the shells, the proxy and the tests import these from here.
__all__ = ["HIGH_WATERMARK_WAIT", "PUT_OVERHEAD", "ConfirmItem", "LinkState", "OutboundItem"]
__all__ += ["QueueRecord", "QueueState", "SessionEngine", "WireAck", "WirePushes"]

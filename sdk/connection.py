"""One connection's life in the engine: its Hello, the HelloReply, the restore that
follows it (rule 4's order), and its end (lost, or refused by a proxy that reaches
no broker).

``SessionEngine`` hands the link inputs here once ``current`` says they are for the
live connection. This module moves the link (``holdfast.sdk.state.LINK_TRANSITIONS``)
and keeps what the engine knows of its connection: the generation, the broker that
answered Hello, whether that broker reads batches. The restore's steps are
``holdfast.sdk.restore``'s; this module decides when each runs and reports
``Connected`` or ``Reconnected``, then ``StateRestored``, and ``ConnectionLost``.
"""

from __future__ import annotations

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.sdk import events as ev
from holdfast.sdk import restore
from holdfast.sdk.discovery import ConsumerQueries
from holdfast.sdk.errors import BrokerUnreachableError, LocalProtocolError
from holdfast.sdk.outbound import Outbound
from holdfast.sdk.outcomes import Outcomes
from holdfast.sdk.producer import Producer
from holdfast.sdk.putbuffer import PutBuffer
from holdfast.sdk.queue_table import QueueTable
from holdfast.sdk.state import LinkEvent, LinkMachine, LinkState
from holdfast.sdk.stats import StatsCounters


class Connection:
    """The engine's current connection (state shared with ``SessionEngine``)."""

    def __init__(
        self,
        link: LinkMachine,
        puts: PutBuffer,
        queues: QueueTable,
        outbound: Outbound,
        out: Outcomes,
        producer: Producer,
        queries: ConsumerQueries,
        counters: StatsCounters,
        client_id: str,
        client_name: str,
        relays_clients: bool = False,
    ) -> None:
        self._link = link
        self._puts = puts
        self._queues = queues
        self._outbound = outbound
        self._out = out
        self._producer = producer
        self._queries = queries
        self._counters = counters
        self._client_id = client_id
        self._client_name = client_name
        # A proxy says so: the broker then limits its session as a proxy's, not a
        # client's (if its token may be a proxy's).
        self._relays_clients = relays_clients
        self.generation = 0
        """Counts connections; frames and deliveries of older connections are stale."""
        self.address = ""
        """The address of the current (or last) connection."""
        self.broker_id = ""
        """The ``broker_id`` of the last HelloReply."""
        self.peer_batches = False
        """Whether this connection's server reads ``ClientFrames`` (its HelloReply)."""
        self.ever_connected = False
        """True once any broker has answered Hello."""
        self._reconnecting = False
        """This connection follows a loss: its restore ends with StateRestored."""

    def current(self, generation: int) -> bool:
        """True if ``generation`` is the live connection; False for one already lost (or
        a session that ended). ``LocalProtocolError`` for one that was never made."""
        if generation > self.generation or generation < 1:
            raise LocalProtocolError(
                f"connection {generation} was never made (the latest is {self.generation})"
            )
        link = self._link
        return not (
            generation != self.generation or link.state is LinkState.DISCONNECTED or link.ended
        )

    def made(self, address: str) -> int:
        """A transport is up: queue the Hello and return this connection's generation."""
        self._link.apply(LinkEvent.CONNECT)
        self.generation += 1
        self.address = address
        self.peer_batches = False  # until this server's HelloReply says otherwise
        hello = pb.Hello(
            protocol_version=PROTOCOL_VERSION,
            client_id=self._client_id,
            client_name=self._client_name,
            accepts_batches=True,
            relays_clients=self._relays_clients,
        )
        self._outbound.add_frame(pb.ClientFrame(hello=hello))
        return self.generation

    def hello_reply(self, reply: pb.HelloReply, now: float) -> None:
        """The broker answered Hello: take its limits, report the connection, and start
        the restore (rule 4, step 1: reopen the queues). Raises ``TerminalTransportError``
        with nothing applied when this SDK cannot work with that broker."""
        self._producer.limits = restore.accept_hello(reply)
        self.broker_id = reply.broker_id
        self.peer_batches = reply.accepts_batches
        self._link.apply(LinkEvent.HELLO_REPLY)
        self._reconnecting = self.ever_connected
        if self.ever_connected:
            self._counters.reconnects += 1
            self._out.emit(ev.Reconnected(self.address, reply.broker_id))
        else:
            self.ever_connected = True
            self._out.emit(ev.Connected(self.address, reply.broker_id))
        self._queries.resend()
        if not restore.reopen_all(self._queues):
            self._finish_restore(now)

    def response(self, response: pb.Response, now: float) -> None:
        """A request was answered; the answer to the last reopen finishes the restore."""
        finished = restore.answer(self._queues, self._out, response)
        if finished and self._link.state is LinkState.RESTORING:
            self._finish_restore(now)

    def lost(self, reason: str) -> None:
        """The connection is gone: buffer everything until the next one."""
        was_up = self._link.connected
        self._link.apply(LinkEvent.LOST)
        self._outbound.clear()  # unsent CONFIRMs are dropped; PUTs stay buffered
        self._puts.release_holds()
        self._queues.link_lost()
        if was_up:
            self._out.emit(ev.ConnectionLost(self.address, reason))

    def no_broker(self, reason: str) -> None:
        """The connection that just ended was refused by a proxy that reaches no broker:
        fail the queues' first opens now, with ``reason`` (``BrokerUnreachableError``);
        queues that were open wait for their reopen."""
        self._link.apply(LinkEvent.NO_BROKER)
        self._queues.fail_first_opens(BrokerUnreachableError(f"not opened: {reason}"))

    def _finish_restore(self, now: float) -> None:
        """Rule 4, steps 2 and 3: retransmit pending PUTs in post order, then report."""
        retransmitted, expired = restore.retransmit(
            self._puts,
            self._queues,
            self._outbound,
            self._out,
            self._producer.limits.dedup_window,
            now,
        )
        self._counters.retransmitted += retransmitted
        self._link.apply(LinkEvent.RESTORED)
        if self._reconnecting:  # every Reconnected is followed by one StateRestored
            self._out.emit(ev.StateRestored(retransmitted, expired))

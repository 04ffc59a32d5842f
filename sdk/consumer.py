"""The consumer's inputs: rule 5 on the path of every CONFIRM and REJECT.

PUSHed messages reach the application through ``holdfast.sdk.outcomes``; settling
one comes back here. A CONFIRM (or REJECT) goes out on the connection that
delivered the message, or not at all: once that connection is gone the broker
redelivers what it held, so a settlement buffered across the loss would settle a
delivery that no longer exists (``ConfirmDroppedError`` says so instead). The same
holds once the session's ``close()`` has begun (``begin_closing``): the writer is
about to end the stream after what is queued, so a later settlement could not leave.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from holdfast.sdk.connection import Connection
from holdfast.sdk.errors import ConfirmDroppedError, QueueNotOpenError
from holdfast.sdk.outbound import CONFIRM_SIZE, ConfirmItem, ConfirmRun, Outbound, RejectItem
from holdfast.sdk.queue_table import QueueRecord, QueueTable
from holdfast.sdk.state import WRITABLE_STATES, LinkMachine
from holdfast.sdk.stats import StatsCounters
from holdfast.sdk.types import Message, Rejection


class Consumer:
    """Checks and queues CONFIRMs and REJECTs for one session (state shared with
    ``SessionEngine``)."""

    def __init__(
        self,
        link: LinkMachine,
        connection: Connection,
        queues: QueueTable,
        outbound: Outbound,
        counters: StatsCounters,
        check_usable: Callable[[], None],
    ) -> None:
        self._link = link
        self._connection = connection
        self._queues = queues
        self._outbound = outbound
        self._counters = counters
        self._check_usable = check_usable
        self._closing = False

    def begin_closing(self) -> None:
        """The session's ``close()`` has begun: from now on every CONFIRM and REJECT is
        refused with ``ConfirmDroppedError`` (those queued before still leave)."""
        self._closing = True

    def confirm(self, message: Message, reject: Rejection | None = None) -> None:
        """Queue a CONFIRM (or with ``reject`` a REJECT); rule 5: never buffered across
        a connection loss."""
        self.confirm_wire(
            message._queue_id, message.guid.bytes, message._generation, reject, message.queue_uri
        )

    def confirm_run(self, queue_id: int, guids: list[bytes], generation: int) -> None:
        """``confirm_wire`` of many deliveries of one queue, all made on connection
        ``generation``: checked once and queued as one item (``guids`` is the engine's
        now). Refused as a whole, before anything is queued, as ``confirm_wire`` would
        refuse each."""
        self._check_link(generation, guids[0] if guids else bytes(16), None)
        queue = self._queue_of(queue_id)
        self._outbound.add(ConfirmRun(queue.queue_id, guids), CONFIRM_SIZE * len(guids))
        self._counters.confirmed += len(guids)

    def _check_link(self, generation: int, guid: bytes, reject: Rejection | None) -> None:
        self._check_usable()
        kind = "CONFIRM" if reject is None else "REJECT"
        if self._closing:
            raise ConfirmDroppedError(
                f"{kind} of {uuid.UUID(bytes=guid)} dropped: the session is closing; "
                "the broker will redeliver the message"
            )
        connected = self._link.connected
        if not connected or generation != self._connection.generation:
            why = "the link is down" if not connected else "it was delivered earlier"
            raise ConfirmDroppedError(
                f"{kind} of {uuid.UUID(bytes=guid)} dropped: {why}"
                + ("" if not connected else " (on an earlier connection)")
                + "; the broker will redeliver the message"
            )

    def _queue_of(self, queue_id: int, queue_uri: str = "") -> QueueRecord:
        queue = self._queues.get(queue_id)
        if queue is None or queue.state not in WRITABLE_STATES:
            raise QueueNotOpenError(f"queue {queue_uri or queue_id} is not open")
        return queue

    def confirm_wire(
        self,
        queue_id: int,
        guid: bytes,
        generation: int,
        reject: Rejection | None = None,
        queue_uri: str = "",
    ) -> None:
        """``confirm()`` of a ``WirePush``: its queue, GUID and connection generation."""
        self._check_link(generation, guid, reject)
        queue = self._queue_of(queue_id, queue_uri)
        if reject is None:
            item: ConfirmItem | RejectItem = ConfirmItem(queue.queue_id, guid)
        else:
            delay_ms = round(reject.delay * 1000)
            item = RejectItem(queue.queue_id, guid, reject.requeue, delay_ms)
        self._outbound.add(item, CONFIRM_SIZE)
        if reject is None:
            self._counters.confirmed += 1
        else:
            self._counters.rejected += 1

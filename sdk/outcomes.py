"""What the application hears: PUT outcomes (rule 3), PUSHed messages and events.

Everything leaves in one ordered list of ``(function, argument)`` callbacks that the
shell runs on one thread, so an application sees ACKs, messages and events in the
order the engine decided them. In ``wire_acks`` mode (the proxy) PUT outcomes are
``(GUID bytes, wire status)`` pairs instead, relayed without a UUID or an ``Ack``.

A frame whose content this SDK cannot accept (a GUID that is not 16 bytes, an ACK
status that is no PUT outcome: ``validate.ACK_STATUSES``, a queue_ids column of the
wrong length or naming a handle never opened, a PUSH batch that breaks the PUSH rules:
``validate.pushes_problem``) raises
``RemoteProtocolError`` *before* any of its items is applied, so the engine stays
consistent and the shell drops the connection.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from itertools import repeat
from typing import Any

from holdfast.proto import pb, status_name
from holdfast.proto.columns import Malformed, PushRow, read_pushes, split_guids
from holdfast.proto.validate import ack_queue_ids_problem, ack_statuses_problem, quote
from holdfast.sdk import events as ev
from holdfast.sdk.errors import HoldfastError, RemoteProtocolError
from holdfast.sdk.guids import ack_from_bytes, uuid_from_bytes
from holdfast.sdk.putbuffer import GUID, ON_ACK, PUT_OVERHEAD, QUEUE_ID, PendingPut, PutBuffer
from holdfast.sdk.queue_table import QueueTable
from holdfast.sdk.segment import Segment
from holdfast.sdk.state import WRITABLE_STATES
from holdfast.sdk.stats import StatsCounters
from holdfast.sdk.statuses import ack_status, session_error, wire_status_of
from holdfast.sdk.types import AckStatus, Message, Settler

log = logging.getLogger("holdfast.sdk.engine")

Callback = tuple[Callable[[Any], Any], Any]

WireAck = tuple[bytes, "pb.Status"]
"""A PUT's outcome in ``wire_acks`` mode: its GUID and a ``pb.Status`` value."""

WirePushes = tuple[list[PushRow], int]
"""PUSHes in ``wire_pushes`` mode: a run of one queue's PUSHes of a frame, in order, as
they were read, and the connection generation they were delivered on
(``SessionEngine.confirm_wire`` and ``confirm_run`` take it back)."""

_SUCCESS = AckStatus.SUCCESS
_STATUS_OK = pb.STATUS_OK
_HISTORY_FULL = pb.STATUS_HISTORY_FULL
_QUEUE_FULL = pb.STATUS_QUEUE_FULL
_PUSHED_BACK = frozenset((_HISTORY_FULL, _QUEUE_FULL, pb.STATUS_LIMIT_EXCEEDED))
_NO_COPY = frozenset((_HISTORY_FULL, _QUEUE_FULL))
"""Push-backs that say the broker holds no copy of the PUT (``PutBuffer.hold``)."""
"""ACK statuses that are no outcome: the broker did not take the PUT *yet*."""


class Outcomes:
    """The ordered outputs for the application, and the ACK and PUSH loops."""

    def __init__(
        self,
        puts: PutBuffer,
        queues: QueueTable,
        on_event: Callable[[ev.SessionEvent], Any],
        *,
        wire_acks: bool,
        wire_pushes: bool = False,
        counters: StatsCounters | None = None,
    ) -> None:
        self.counters = counters or StatsCounters()
        """Outcomes by status and deliveries are counted here, where they are decided."""
        self._puts = puts
        self._wire_pushes = wire_pushes
        self._queues = queues
        self._on_event = on_event
        self.callbacks: list[Callback] = []
        self.wire_acks: list[WireAck] | None = [] if wire_acks else None
        self.stale_acks = 0
        """ACKs for GUIDs no longer pending (for example, duplicates); ignored."""

    def take_callbacks(self) -> list[Callback]:
        """Callbacks for the application, in the order they must run."""
        callbacks, self.callbacks = self.callbacks, []
        return callbacks

    def take_wire_acks(self) -> list[WireAck]:
        """PUT outcomes as ``(GUID bytes, wire status)``, in order (``wire_acks`` mode)."""
        acks = self.wire_acks
        if not acks:
            return []
        self.wire_acks = []
        return acks

    def emit(self, event: ev.SessionEvent) -> None:
        """Queue an event for ``on_event``, in order with everything else."""
        self.callbacks.append((self._on_event, event))

    def report(self, put: PendingPut, status: AckStatus) -> None:
        """Remove a PUT from the buffer and report it once (its queue is still known)."""
        if self._puts.pop(put[GUID]) is None:
            return
        self.counters.acks[status] += 1
        if self.wire_acks is not None:
            self.wire_acks.append((put[GUID], wire_status_of(status)))
            return
        queue = self._queues.by_id[put[QUEUE_ID]]
        callback = put[ON_ACK]
        if callback is None:
            callback = queue.on_ack
        if callback is not None:
            self.callbacks.append((callback, ack_from_bytes(put[GUID], status, queue.uri)))

    def acks(self, batch: pb.AckBatch, now: float) -> None:
        """Rule 3: each ACK pops its PUT and reports it once; unknown GUIDs are stale.

        ``HISTORY_FULL`` and ``QUEUE_FULL`` are not outcomes: the PUT stays buffered
        and is sent again after a back-off (``PutBuffer.hold``). A batch in the "all
        SUCCESS" form (no statuses column) is taken without a status per ACK."""
        # Read once: each read of a protobuf bytes field is a new copy of all of it, and
        # behind a proxy (many clients' runs of a few PUTs) the loop below matched one
        # run per read: 16 % of the proxy's loop at 300 sessions.
        packed = batch.guids
        try:
            guids = split_guids(packed, "ACK batch")
        except Malformed as error:
            raise RemoteProtocolError(f"the server sent {error.message}") from None
        statuses = batch.statuses
        # Checked whole before any ACK is applied: a status byte no ACK carries (200,
        # UNSPECIFIED), or a queue_ids column of the wrong length or naming a handle
        # never opened, ends the connection, and every PUT of the batch stays buffered.
        if statuses and (problem := ack_statuses_problem(statuses, len(guids))) is not None:
            raise RemoteProtocolError(f"the server sent {problem}")
        chosen = self._queues.last_queue_id
        if (problem := ack_queue_ids_problem(batch.queue_ids, len(guids), chosen)) is not None:
            raise RemoteProtocolError(f"the server sent {problem}")
        puts = self._puts
        segments = puts.segments
        locate = puts.locate
        released = 0
        relay = self.wire_acks.append if self.wire_acks is not None else None
        queues = self._queues.by_id
        append = self.callbacks.append
        held = puts.held
        busy = puts.busy
        reported = 0
        by_status = self.counters.acks
        count = len(guids)
        k = 0
        while k < count:
            if not statuses:
                # ACKs in post order, all OK (the usual): a run at a time, compared whole.
                segment, i, n = segments.match_run(packed, k, count - k)
                if n:
                    released += self._run(segment, i, guids, k, n)
                    reported += n
                    k += n
                    continue
                wire: int = _STATUS_OK
            else:
                wire = statuses[k]
            guid = guids[k]
            k += 1
            if wire in _PUSHED_BACK and relay is None:
                # Kept and retried here; a proxy relays the push-back instead, so that its
                # client keeps the PUT and its post() waits as against a broker (rule 7).
                puts.hold(guid, now, wire in _NO_COPY)
                continue
            found = locate(guid)
            if found is None:
                self.stale_acks += 1
                continue
            seq, segment, i = found
            released += segment.size(i) + PUT_OVERHEAD
            if wire == _STATUS_OK:
                reported += 1
            else:
                by_status[ack_status(wire)] += 1
            queue_id = segment.queue_ids[i]
            extra = segment.extras.get(i) if segment.extras else None
            if held:
                held.pop(seq, None)
            if busy:
                busy.discard(queue_id)
            segments.release(segment, i)
            if relay is not None:
                relay((guid, wire))  # type: ignore[arg-type]  # a Status value
                continue
            # A queue leaves the table only once its pending PUTs are reported.
            queue = queues[queue_id]
            callback = queue.on_ack if extra is None or extra[1] is None else extra[1]
            if callback is not None:
                status = _SUCCESS if wire == _STATUS_OK else ack_status(wire)
                append((callback, ack_from_bytes(guid, status, queue.uri)))
        if released:
            puts.bytes -= released
            puts.taken()
        if reported:
            by_status[_SUCCESS] += reported

    def _run(self, segment: Segment, i: int, guids: list[bytes], k: int, n: int) -> int:
        """Report the ``n`` PUTs from index ``i`` of ``segment`` SUCCESS (their GUIDs from
        ``k`` in ``guids``); the bytes they released."""
        ends = segment.ends
        released = ends[i + n - 1] - (ends[i - 1] if i else 0) + n * PUT_OVERHEAD
        extras = segment.extras
        if extras:  # the bytes their properties added
            released += sum(extra[2] for j in range(i, i + n) if (extra := extras.get(j)))
        queue_ids = segment.queue_ids
        puts = self._puts
        if puts.held:
            for seq in range(segment.base + i, segment.base + i + n):
                puts.held.pop(seq, None)
        if puts.busy:
            puts.busy.difference_update(queue_ids[i : i + n])
        if self.wire_acks is not None:
            self.wire_acks.extend(zip(guids[k : k + n], repeat(_STATUS_OK)))
        else:
            queues = self._queues.by_id
            append = self.callbacks.append
            queue_id = queue_ids[i]
            queue = queues[queue_id]
            for index, guid in zip(range(i, i + n), guids[k : k + n], strict=True):
                if queue_ids[index] != queue_id:
                    queue_id = queue_ids[index]
                    queue = queues[queue_id]
                callback = queue.on_ack
                if extras and (extra := extras.get(index)) is not None and extra[1] is not None:
                    callback = extra[1]
                if callback is not None:
                    append((callback, ack_from_bytes(guid, _SUCCESS, queue.uri)))
        puts.segments.release_run(segment, i, n)
        return released

    def pushes(self, batch: pb.PushBatch, generation: int, confirmer: Settler) -> None:
        """PUSHed messages to their queue's ``on_message``, tagged with the connection: as
        a ``Message``, or in ``wire_pushes`` mode (the proxy, which relays them to its
        own clients) by runs of one queue as ``WirePushes``, without a ``UUID``, a
        dict, a ``Message`` or a callback per delivery."""
        try:
            pushes = read_pushes(batch)
        except Malformed as error:
            raise RemoteProtocolError(f"the server sent {error.message}") from None
        queues = self._queues.by_id
        append = self.callbacks.append
        wire = self._wire_pushes
        # Wall clock, not the engine's monotonic ``now``: an acceptance date for users.
        arrived = time.time()
        counters = self.counters
        if wire:
            self._wire_runs(pushes, generation)
            return
        for queue_id, push in pushes:
            queue = queues.get(queue_id)
            if queue is None or queue.on_message is None or queue.state not in WRITABLE_STATES:
                continue  # closed meanwhile: the broker redelivers it elsewhere
            counters.delivered += 1
            properties = push.properties
            message = Message(
                uuid_from_bytes(push.guid),
                push.payload,
                # Not dict(): protobuf's map is a Mapping only by registration, so
                # dict() goes through the pure-Python KeysView (twice as slow).
                {key: properties[key] for key in properties},
                push.delivery_count,
                queue.uri,
                confirmer,
                queue.queue_id,
                generation,
                accepted_at=arrived - push.age_ms / 1000,
            )
            append((queue.on_message, message))

    def _wire_runs(self, pushes: list[tuple[int, PushRow]], generation: int) -> None:
        """``pushes`` in ``wire_pushes`` mode: one callback per run of one queue."""
        queues = self._queues.by_id
        runs: list[tuple[Callable[[Any], Any], list[PushRow]]] = []
        run: list[PushRow] = []
        last_id = -1
        for queue_id, push in pushes:
            if queue_id != last_id:
                last_id = queue_id
                queue = queues.get(queue_id)
                if queue is None or queue.on_message is None or queue.state not in WRITABLE_STATES:
                    run = []  # closed meanwhile: the broker redelivers these elsewhere
                    continue
                run = []
                runs.append((queue.on_message, run))
            run.append(push)
        append = self.callbacks.append
        for on_message, taken in runs:
            if taken:
                self.counters.delivered += len(taken)
                append((on_message, (taken, generation)))

    def error_frame(self, error: pb.Error) -> HoldfastError | None:
        """An Error frame: refused CONFIRMs reach the application as ``ConfirmRejected``;
        a version mismatch or a refused token is returned as the error the session fails
        with (``statuses.session_error``); the rest is logged (the broker ends the stream
        after a fatal error; the shell sees it end)."""
        name = status_name(error.status)
        failure = session_error(error.status, error.message)
        if failure is not None:
            return failure
        queue = self._queues.get(error.queue_id)
        if error.status == pb.STATUS_UNKNOWN_GUID and queue is not None:
            guids = tuple(uuid.UUID(bytes=g) for g in error.guids if len(g) == 16)
            if self._wire_pushes:
                # A proxy's upstream: the proxy passes the refusal on to the one client
                # whose handle it was (``holdfast.proxy.server``).
                self.emit(ev.HandleConfirmRejected(queue.uri, guids, name, error.queue_id))
            else:
                self.emit(ev.ConfirmRejected(queue.uri, guids, name))
            return None
        if error.status == pb.STATUS_DELIVERIES_REVOKED and queue is not None:
            guids = tuple(uuid.UUID(bytes=g) for g in error.guids if len(g) == 16)
            self.emit(ev.DeliveriesRevoked(queue.uri, guids))
            return None
        if error.status == pb.STATUS_DATA_LOST:
            uri = None if queue is None else queue.uri
            self.emit(ev.DataLost(quote(error.message, 2000), uri))
            return None
        log.warning(
            "broker reported %s: %s (fatal=%s)", name, quote(error.message, 200), error.fatal
        )
        return None

"""A client's CONFIRMs and REJECTs, settled upstream by the delivery they name.

A CONFIRM goes upstream only for a message delivered on the current upstream
connection; one delivered on an earlier connection is answered as stale
(UNKNOWN_GUID), since the broker has already taken it back for redelivery. A CONFIRM
names only a GUID, so when the client holds a stale delivery and the redelivery of
one message, it settles the redelivery (the client processed the message either way)
and a second CONFIRM of that GUID uses up the stale delivery, refused as stale.

A stale refusal is the proxy's doing, not the client's: its upstream reconnected (a
broker outage its clients are not told of) after it had delivered the message. Such
refusals are counted apart (``ConfirmRelay.blameless``) and do not count against the
client's refused-CONFIRM limit; a CONFIRM of a GUID this client was never delivered does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from holdfast.proto import pb
from holdfast.proxy.routes import ClientHandle, deliveries_of
from holdfast.proxy.upstream import Upstream
from holdfast.sdk.errors import ConfirmDroppedError, HoldfastError
from holdfast.sdk.types import Rejection


class ConfirmRelay:
    """Settles one client's CONFIRMs and REJECTs on the proxy's upstream session."""

    def __init__(self, upstream: Upstream, handles: Mapping[int, ClientHandle]) -> None:
        self._upstream = upstream
        self._handles = handles
        self.blameless = 0
        """How many of the last ``confirm``'s or ``settle``'s refusals named a delivery
        this proxy did make to the client, refused because its upstream link (or handle)
        changed since: not the client's fault."""

    def confirm(self, batch: list[tuple[int, bytes]]) -> dict[tuple[pb.Status, int], list[bytes]]:
        """``settle`` for a ConfirmBatch's (handle, GUID) rows. A delivery made on the
        current upstream connection, the only one of its GUID (the usual case), is
        CONFIRMed upstream with the others of its run of one handle, as one item; the
        rest goes through ``settle`` one by one, in its place."""
        rejected: dict[tuple[pb.Status, int], list[bytes]] = {}
        self.blameless = 0
        handles = self._handles
        generation = self._upstream.engine.generation
        run: list[bytes] = []
        run_id = -1
        handle: ClientHandle | None = None
        delivered: dict[bytes, int | deque[int]] | None = None
        for queue_id, guid in batch:
            if queue_id != run_id:
                if run:
                    self._confirm_run(handle, run_id, run, generation, rejected)
                    run = []
                run_id = queue_id
                handle = handles.get(queue_id)
                delivered = (
                    handle.delivered
                    if handle is not None and handle.read and handle.upstream is not None
                    else None
                )
            if delivered is not None:
                deliveries = delivered.pop(guid, None)
                if deliveries is not None:
                    # An int is the GUID's one delivery (``ClientHandle.delivered``).
                    if deliveries == generation and isinstance(deliveries, int):
                        run.append(guid)
                        continue
                    delivered[guid] = deliveries
            if run:
                self._confirm_run(handle, run_id, run, generation, rejected)
                run = []
            self._settle_into(rejected, queue_id, guid, None)
        if run:
            self._confirm_run(handle, run_id, run, generation, rejected)
        self._upstream.queued()
        return rejected

    def _confirm_run(
        self,
        handle: ClientHandle | None,
        queue_id: int,
        guids: list[bytes],
        generation: int,
        rejected: dict[tuple[pb.Status, int], list[bytes]],
    ) -> None:
        """CONFIRM upstream ``guids``, whose one delivery each (on ``generation``) was
        taken from ``handle`` already: refused together as each would be alone."""
        assert handle is not None and handle.upstream is not None
        status: pb.Status
        try:
            self._upstream.engine.confirm_run(handle.upstream.queue_id, guids, generation)
        except ConfirmDroppedError:
            status = pb.STATUS_UNKNOWN_GUID
        except HoldfastError:
            status = pb.STATUS_UNKNOWN_QUEUE
        else:
            return
        self.blameless += len(guids)  # delivered by this proxy: its link changed since
        rejected.setdefault((status, queue_id), []).extend(guids)

    def settle(
        self, items: Iterable[tuple[int, bytes, Rejection | None]]
    ) -> dict[tuple[pb.Status, int], list[bytes]]:
        """Settle each (handle, GUID, REJECT or None for a CONFIRM) upstream; the refused
        ones by (status, handle), for the client's Error frames."""
        rejected: dict[tuple[pb.Status, int], list[bytes]] = {}
        self.blameless = 0
        for queue_id, guid, reject in items:
            self._settle_into(rejected, queue_id, guid, reject)
        self._upstream.queued()
        return rejected

    def _settle_into(
        self,
        rejected: dict[tuple[pb.Status, int], list[bytes]],
        queue_id: int,
        guid: bytes,
        reject: Rejection | None,
    ) -> None:
        handle = self._handles.get(queue_id)
        status: pb.Status
        if handle is None:
            status = pb.STATUS_UNKNOWN_QUEUE
        elif not handle.read:
            status = pb.STATUS_NOT_READABLE
        else:
            settled = self._confirm_upstream(handle, guid, reject)
            if settled is None:
                return
            status = settled
        rejected.setdefault((status, queue_id), []).append(guid)

    def _confirm_upstream(
        self, handle: ClientHandle, guid: bytes, reject: Rejection | None = None
    ) -> pb.Status | None:
        """CONFIRM (or REJECT) upstream this client's delivery of ``guid`` made on the current
        upstream connection; None if sent, else the status to refuse it with.

        Settling the oldest delivery instead would refuse the CONFIRM of a redelivery
        while the client still holds the stale one: the broker would then keep the
        message outstanding with this client, never removed nor redelivered.
        """
        deliveries = deliveries_of(handle.delivered, guid)
        if not deliveries:
            return pb.STATUS_UNKNOWN_GUID  # never delivered to this client (or settled)
        self.blameless += 1  # refused below only because the upstream changed
        if handle.upstream is None:
            return pb.STATUS_UNKNOWN_GUID
        status: pb.Status | None = pb.STATUS_UNKNOWN_GUID  # all stale: taken back already
        used = 0  # the delivery this CONFIRM uses up: the oldest, unless one was settled
        confirm = self._upstream.engine.confirm_wire  # the writer is woken per frame
        queue_id = handle.upstream.queue_id
        for index, generation in enumerate(deliveries):
            try:
                confirm(queue_id, guid, generation, reject)
            except ConfirmDroppedError:
                continue
            except HoldfastError:
                status = pb.STATUS_UNKNOWN_QUEUE
            else:
                # The stale deliveries stay: the client's CONFIRM of one of them is
                # refused as stale then, without counting against it.
                status, used = None, index
                self.blameless -= 1
            break
        del deliveries[used]
        if not deliveries:
            del handle.delivered[guid]
        return status


__all__ = ["ConfirmRelay"]

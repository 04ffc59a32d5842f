"""A client's CONFIRMs and REJECTs, settled upstream by the delivery they name.

A CONFIRM goes upstream only for a message delivered on the current upstream
connection; one delivered on an earlier connection is answered as stale
(UNKNOWN_GUID), since the broker has already taken it back for redelivery. A CONFIRM
names only a GUID, so when the client holds a stale delivery and the redelivery of
one message, it settles the redelivery (the client processed the message either way)
and a second CONFIRM of that GUID is refused as stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from holdfast.proto import pb
from holdfast.proxy.routes import ClientHandle
from holdfast.proxy.upstream import Upstream
from holdfast.sdk.errors import ConfirmDroppedError, HoldfastError
from holdfast.sdk.types import Rejection


class ConfirmRelay:
    """Settles one client's CONFIRMs and REJECTs on the proxy's upstream session."""

    def __init__(self, upstream: Upstream, handles: Mapping[int, ClientHandle]) -> None:
        self._upstream = upstream
        self._handles = handles

    def settle(
        self, items: Iterable[tuple[int, bytes, Rejection | None]]
    ) -> dict[tuple[pb.Status, int], list[bytes]]:
        """Settle each (handle, GUID, REJECT or None for a CONFIRM) upstream; the refused
        ones by (status, handle), for the client's Error frames."""
        rejected: dict[tuple[pb.Status, int], list[bytes]] = {}
        handles = self._handles
        for queue_id, guid, reject in items:
            handle = handles.get(queue_id)
            status: pb.Status
            if handle is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif not handle.read:
                status = pb.STATUS_NOT_READABLE
            else:
                settled = self._confirm_upstream(handle, guid, reject)
                if settled is None:
                    continue
                status = settled
            rejected.setdefault((status, queue_id), []).append(guid)
        self._upstream.queued()
        return rejected

    def _confirm_upstream(
        self, handle: ClientHandle, guid: bytes, reject: Rejection | None = None
    ) -> pb.Status | None:
        """CONFIRM (or REJECT) upstream this client's delivery of ``guid`` made on the current
        upstream connection; None if sent, else the status to refuse it with.

        Settling the oldest delivery instead would refuse the CONFIRM of a redelivery
        while the client still holds the stale one: the broker would then keep the
        message outstanding with this client, never removed nor redelivered.
        """
        deliveries = handle.delivered.get(guid)
        if not deliveries or handle.upstream is None:
            return pb.STATUS_UNKNOWN_GUID
        status: pb.Status | None = pb.STATUS_UNKNOWN_GUID  # all stale: taken back already
        done = 1
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
                # The stale deliveries before it are done with too: a later CONFIRM
                # of this GUID is refused as stale, whichever delivery it meant.
                status, done = None, index + 1
            break
        for _ in range(done):
            deliveries.popleft()
        if not deliveries:
            del handle.delivered[guid]
        return status


__all__ = ["ConfirmRelay"]

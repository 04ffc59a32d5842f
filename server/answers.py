"""The frames a server stream answers with: responses, errors, consumer counts. A
mixin of ``ContractStream`` (its ``outbox`` and ``session_id``), apart so that the
stream module keeps to reading frames and the stream's life."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from holdfast.proto import pb, status_name
from holdfast.server.outbox import Outbox

log = logging.getLogger("holdfast.server.stream")


class Answers:
    """Answers queued in order in the stream's outbox."""

    outbox: Outbox
    session_id: str

    def send(self, frame: pb.ServerFrame) -> None:
        """Queue a frame in order with the other answers."""
        self.outbox.send(frame)

    def respond(
        self,
        request_id: int,
        status: pb.Status,
        message: str = "",
        holds_pushes: bool = False,
    ) -> None:
        """Answer a request. With ``holds_pushes`` no PUSH is written before this answer
        (the Response that opens a consumer's handle)."""
        response = pb.Response(request_id=request_id, status=status, message=message)
        self.outbox.send(pb.ServerFrame(response=response), holds_pushes)

    def error(
        self,
        status: pb.Status,
        message: str,
        queue_id: int = 0,
        guids: Iterable[bytes] = (),
        fatal: bool = False,
    ) -> None:
        """Send a typed Error frame."""
        error = pb.Error(
            status=status, message=message, queue_id=queue_id, guids=guids, fatal=fatal
        )
        self.outbox.send(pb.ServerFrame(error=error))
        if not fatal:
            log.debug("session %s: %s: %s", self.session_id, status_name(status), message)

    def count_answer(
        self, request_id: int, consumers: int, status: pb.Status = pb.STATUS_OK, message: str = ""
    ) -> None:
        """Answer a CountConsumers."""
        answer = pb.ConsumerCount(
            request_id=request_id, status=status, message=message, consumers=consumers
        )
        self.outbox.send(pb.ServerFrame(consumer_count=answer))

    def respond_not_open(self, request_id: int, queue_id: int) -> None:
        """Answer a request about a queue handle that is not open on this stream."""
        self.respond(request_id, pb.STATUS_UNKNOWN_QUEUE, f"queue_id {queue_id} is not open")


CONFIRM_ERRORS: dict[pb.Status, str] = {
    pb.STATUS_UNKNOWN_QUEUE: "CONFIRM or REJECT on a queue_id that is not open",
    pb.STATUS_NOT_READABLE: "CONFIRM or REJECT on a queue handle opened without read",
    pb.STATUS_UNKNOWN_GUID: (
        "CONFIRM or REJECT of GUIDs this consumer does not hold unconfirmed (through a proxy: "
        "delivered on an earlier broker connection, and redelivered since)"
    ),
}
"""Why a CONFIRM (or a REJECT) was refused, by status."""

__all__ = ["CONFIRM_ERRORS", "Answers"]

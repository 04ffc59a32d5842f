"""Rule 4, the reconnect: reopen every queue, then retransmit every pending PUT.

After a HelloReply the session reopens its queues in the order they were opened,
each with its latest options (``reopen_all``); answers come back through
``answer``; once every reopen is answered, the pending PUTs are retransmitted in
post order (``retransmit``), except those whose age is past what the broker can
still recognise, which are reported UNKNOWN. ``SessionEngine`` sequences these
steps and reports ``QueueReopened`` and ``StateRestored``.
"""

from __future__ import annotations

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.proto.limits import Limits, limits_from_hello
from holdfast.sdk import events as ev
from holdfast.sdk.errors import HoldfastError, ProtocolVersionError, TerminalTransportError
from holdfast.sdk.outbound import Outbound
from holdfast.sdk.outcomes import Outcomes
from holdfast.sdk.putbuffer import POSTED_AT, QUEUE_ID, SIZE, PutBuffer, retransmit_margin
from holdfast.sdk.queue_table import QueueTable
from holdfast.sdk.resend import ResendRun, spans_to_resend
from holdfast.sdk.state import QueueState
from holdfast.sdk.statuses import request_error
from holdfast.sdk.types import AckStatus


def accept_hello(reply: pb.HelloReply) -> Limits:
    """The limits a HelloReply announces; ``TerminalTransportError`` (a subclass:
    ``ProtocolVersionError``) when this SDK cannot work with that broker."""
    if reply.protocol_version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"broker speaks protocol {reply.protocol_version}, this SDK speaks {PROTOCOL_VERSION}"
        )
    try:
        return limits_from_hello(reply)
    except ValueError as error:
        raise TerminalTransportError(f"the broker announced unusable limits: {error}") from None


def reopen_all(queues: QueueTable) -> bool:
    """Step 1: re-send the open of every queue that was open or opening, in open order
    (their waiters are answered by it). Returns True if any reopen is now in flight."""
    for queue in queues:
        if queue.state in (QueueState.OPEN, QueueState.OPENING):
            waiters, queue.waiters = queue.waiters, []
            queues.send_open(queue, waiters, reopen=queue.ever_opened)
            queues.restoring.add(queue.queue_id)
    return bool(queues.restoring)


def answer(queues: QueueTable, out: Outcomes, response: pb.Response) -> bool:
    """Apply a Response; True if it answered the last reopen the restore waited for."""
    request = queues.answered(response.request_id)
    if request is None:
        return False  # an answer to a request given up meanwhile
    queue = request.queue
    # Read before the answer is handled: a refused (re)open forgets the queue, which
    # takes it out of ``restoring`` too, and the restore must still finish.
    restoring = request.kind == "open" and queue.queue_id in queues.restoring
    error: HoldfastError | None = None
    if response.status != pb.STATUS_OK:
        error = request_error(response.status, response.message)
    if request.kind == "open":
        if error is not None and request.reopen and queue.state is not QueueState.ABANDONED:
            out.emit(ev.QueueReopened(queue.uri, str(error)))
        if queues.opened(queue, request, error) and request.reopen:
            out.emit(ev.QueueReopened(queue.uri))
    elif request.kind == "close":
        queues.close_locally(queue)
    queues.complete(request.resolves, error)
    if not restoring:
        return False
    queues.restoring.discard(queue.queue_id)
    return not queues.restoring


def retransmit(
    puts: PutBuffer,
    queues: QueueTable,
    outbound: Outbound,
    out: Outcomes,
    window: float,
    now: float,
) -> tuple[int, int]:
    """Step 2: queue every pending PUT again, in post order; a PUT whose age is past the
    window less the margin is reported UNKNOWN instead. Returns (retransmitted, expired)."""
    horizon = now - window + retransmit_margin(window)
    if puts.keyed:
        return _retransmit_run(puts, queues, outbound, out, horizon)
    retransmitted = expired = 0
    by_id = queues.by_id
    for put in puts:
        if put[POSTED_AT] <= horizon:
            # Past what the broker can still recognise: a retransmit would be refused
            # (TOO_OLD) or, by a broker that forgot it, enqueued a second time.
            out.report(put, AckStatus.UNKNOWN)
            expired += 1
        elif (queue := by_id.get(put[QUEUE_ID])) and queue.state is QueueState.CLOSING:
            continue  # reported UNKNOWN when its close completes; sending it is waste
        else:
            outbound.add(put, put[SIZE])
            retransmitted += 1
    return retransmitted, expired


def _retransmit_run(
    puts: PutBuffer, queues: QueueTable, outbound: Outbound, out: Outcomes, horizon: float
) -> tuple[int, int]:
    """``retransmit`` for a proxy: one ``ResendRun`` item, read out as it is sent."""
    closing = frozenset(q.queue_id for q in queues if q.state is QueueState.CLOSING)
    spans, expired, count, total = spans_to_resend(puts, horizon, closing)
    for put in expired:
        out.report(put, AckStatus.UNKNOWN)
    if count:
        outbound.add(ResendRun(spans, closing, total, outbound), total)
    return count, len(expired)

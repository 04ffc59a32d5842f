"""Session events: how connection state reaches the application.

A session calls its ``on_event`` handler (default: ``log_event``) on its
dispatcher thread, in this order around an outage::

    ConnectionLost -> Reconnected -> QueueReopened (one per open queue) -> StateRestored

``Connected`` marks the first connection, ``ConnectAttemptFailed`` each failed
attempt while (re)connecting, ``ConfirmRejected`` CONFIRMs the broker did not
recognise, ``DeliveriesRevoked`` deliveries a broker node voided (it lost its lease
on a Redis store), ``DataLost`` a store that lost acknowledged data,
``SessionFailed`` a terminal error and ``SessionClosed`` the end.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

log = logging.getLogger("holdfast.sdk")


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """Base class of every session event."""


@dataclass(frozen=True, slots=True)
class Connected(SessionEvent):
    """The session's first connection is up (Hello answered)."""

    address: str
    broker_id: str


@dataclass(frozen=True, slots=True)
class ConnectionLost(SessionEvent):
    """An established connection dropped; PUTs are buffered until it is back."""

    address: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConnectAttemptFailed(SessionEvent):
    """A connection attempt failed; the next one starts in ``retry_in`` seconds."""

    address: str
    reason: str
    retry_in: float


@dataclass(frozen=True, slots=True)
class Reconnected(SessionEvent):
    """A new connection is up after a loss; queues are being reopened."""

    address: str
    broker_id: str


@dataclass(frozen=True, slots=True)
class QueueReopened(SessionEvent):
    """One queue that was open has been reopened (``error`` is None) or could not be."""

    queue_uri: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the queue was reopened."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class StateRestored(SessionEvent):
    """Every queue is reopened and every unacknowledged PUT retransmitted.

    ``expired`` PUTs were older than the broker's dedup window, so they were not
    retransmitted but reported to their ``on_ack`` with ``AckStatus.UNKNOWN``.
    """

    retransmitted: int
    expired: int


@dataclass(frozen=True, slots=True)
class ConfirmRejected(SessionEvent):
    """The broker did not recognise these CONFIRMs (for example, already redelivered)."""

    queue_uri: str
    guids: tuple[uuid.UUID, ...]
    status: str


@dataclass(frozen=True, slots=True)
class HandleConfirmRejected(ConfirmRejected):
    """``ConfirmRejected`` as a proxy's upstream session reports it (``wire_pushes``
    mode), naming ``queue_id``, the upstream queue handle the refused CONFIRMs (or
    REJECTs) were on. Each client of a proxy consumes on upstream handles of its own,
    several perhaps on one queue: the handle says whose refusal it is."""

    queue_id: int


@dataclass(frozen=True, slots=True)
class DeliveriesRevoked(SessionEvent):
    """The broker node lost its lease on its store (a Redis link that stalled or slowed
    past the lease): these deliveries are void. A CONFIRM of one that reaches the node
    after it learned of the lapse is refused (``ConfirmRejected``); one it took before
    (its store write then fenced) is void with the delivery, reported by this event
    alone. Either way each message is delivered again, once, by a node that holds a
    lease, and work already done for it will be offered again."""

    queue_uri: str
    guids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class DataLost(SessionEvent):
    """The broker's store lost data it had acknowledged (Redis restarted from an older
    snapshot, failed over to a replica that lagged, or was flushed): messages ACKed
    SUCCESS may be gone, and messages confirmed may be delivered again. ``queue_uri``
    names a queue of this session the loss hit; None for the broker-wide report.
    ``message`` says what the broker could count."""

    message: str
    queue_uri: str | None = None


@dataclass(frozen=True, slots=True)
class SessionFailed(SessionEvent):
    """A terminal error: the session stopped reconnecting. ``error`` says why."""

    error: str


@dataclass(frozen=True, slots=True)
class SessionClosed(SessionEvent):
    """The session was closed; ``unknown`` PUTs were still unacknowledged and reported UNKNOWN."""

    unknown: int


_WARNING_EVENTS = (
    ConnectionLost,
    ConnectAttemptFailed,
    ConfirmRejected,
    DeliveriesRevoked,
    SessionFailed,
)


ATTEMPT_LOG_INTERVAL = 10.0
"""Seconds between two logged failed connection attempts to the same address."""

_attempts_lock = threading.Lock()
_attempts: dict[str, tuple[float, int]] = {}
"""Per address: when a failed attempt was last logged, and how many were not since."""


def log_event(event: SessionEvent) -> None:
    """The default ``on_event`` handler: log the event on the ``holdfast.sdk`` logger,
    one line each. Failed connection attempts, which come several times a second while
    a server is down, are logged once per ``ATTEMPT_LOG_INTERVAL`` per address, with
    the count of those not logged; a connection that succeeds logs again at once."""
    if isinstance(event, ConnectAttemptFailed):
        _log_attempt(event)
        return
    if isinstance(event, Connected | Reconnected):
        with _attempts_lock:
            _attempts.pop(event.address, None)
    failed_reopen = isinstance(event, QueueReopened) and not event.ok
    if isinstance(event, DataLost):
        log.error("%s", event)
    elif failed_reopen or isinstance(event, _WARNING_EVENTS):
        log.warning("%s", event)
    else:
        log.info("%s", event)


def _log_attempt(event: ConnectAttemptFailed) -> None:
    now = time.monotonic()
    with _attempts_lock:
        last, quiet = _attempts.get(event.address, (float("-inf"), 0))
        if now - last < ATTEMPT_LOG_INTERVAL:
            _attempts[event.address] = (last, quiet + 1)
            return
        _attempts[event.address] = (now, 0)
    more = f" ({quiet} more failed attempts not logged)" if quiet else ""
    reason = " ".join(event.reason.split())  # one line, whatever the transport said
    log.warning(
        "cannot connect to %s: %s; retrying in %.2f s%s",
        event.address,
        reason[:300],
        event.retry_in,
        more,
    )

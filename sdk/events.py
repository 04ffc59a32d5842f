"""Session events: how connection state reaches the application.

A session calls its ``on_event`` handler (default: ``log_event``) on its
dispatcher thread, in this order around an outage::

    ConnectionLost -> Reconnected -> QueueReopened (one per open queue) -> StateRestored

``Connected`` marks the first connection, ``ConnectAttemptFailed`` each failed
attempt while (re)connecting, ``ConfirmRejected`` CONFIRMs the broker did not
recognise, ``SessionFailed`` a terminal error and ``SessionClosed`` the end.
"""

from __future__ import annotations

import logging
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
class SessionFailed(SessionEvent):
    """A terminal error: the session stopped reconnecting. ``error`` says why."""

    error: str


@dataclass(frozen=True, slots=True)
class SessionClosed(SessionEvent):
    """The session was closed; ``unknown`` PUTs were still unacknowledged and reported UNKNOWN."""

    unknown: int


_WARNING_EVENTS = (ConnectionLost, ConnectAttemptFailed, ConfirmRejected, SessionFailed)


def log_event(event: SessionEvent) -> None:
    """The default ``on_event`` handler: log the event on the ``holdfast.sdk`` logger."""
    failed_reopen = isinstance(event, QueueReopened) and not event.ok
    if failed_reopen or isinstance(event, _WARNING_EVENTS):
        log.warning("%s", event)
    else:
        log.info("%s", event)

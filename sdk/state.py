"""The engine's two state machines, as tables: the link, and each queue handle.

Read the tables first; they are the whole story. Every state change of
``SessionEngine`` goes through ``LinkMachine.apply`` or ``QueueRecord.apply``
(``holdfast.sdk.queue_table``), and an event a table has no entry for raises
``LocalProtocolError``: the shell fed the engine an input that cannot happen (a
``connection_made`` while a connection is live, say), which is a bug to surface at
once, not to absorb. (Illegal frames *from the server* are ``RemoteProtocolError``:
they end the connection, see ``SessionEngine.frame_received``.)

The link, one connection at a time::

    DISCONNECTED --CONNECT--> HANDSHAKING --HELLO_REPLY--> RESTORING --RESTORED--> ACTIVE
         ^                        |                            |                     |
         +----------LOST----------+------------LOST------------+--------LOST---------+
    DISCONNECTED --NO_BROKER--> DISCONNECTED   (the connection that just ended was
                                refused by a proxy that reaches no broker)
    any but CLOSED --FAIL--> FAILED          any but CLOSED --CLOSE--> CLOSED

A queue handle::

    OPENING --OPEN_OK--> OPEN --REOPEN_SENT--> REOPENING --OPEN_OK / LINK_LOST--> OPEN
       |                  |                       |
       ABANDON            CLOSE_SENT              CLOSE_SENT
       v                  v                       v
    ABANDONED --CLOSE_SENT--> CLOSING  <----------+
    (any) --FORGET--> CLOSED       (closed locally, refused, answered, or abandoned)
"""

from __future__ import annotations

import enum
from typing import Final

from holdfast.sdk.errors import LocalProtocolError


class LinkState(enum.Enum):
    """Where the engine is in the life of its current connection."""

    DISCONNECTED = "disconnected"
    HANDSHAKING = "handshaking"
    RESTORING = "restoring"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


class LinkEvent(enum.Enum):
    """What moves the link."""

    CONNECT = "connect"  # a transport is up; Hello is queued
    HELLO_REPLY = "hello_reply"  # the broker answered Hello
    RESTORED = "restored"  # every queue reopened, pending PUTs retransmitted
    LOST = "lost"  # the connection ended
    NO_BROKER = "no_broker"  # the ended connection's proxy said it reaches no broker
    FAIL = "fail"  # a terminal error
    CLOSE = "close"  # the application closed the session


_L, _E = LinkState, LinkEvent

LINK_TRANSITIONS: Final[dict[LinkState, dict[LinkEvent, LinkState]]] = {
    _L.DISCONNECTED: {
        _E.CONNECT: _L.HANDSHAKING,
        _E.NO_BROKER: _L.DISCONNECTED,
        _E.FAIL: _L.FAILED,
        _E.CLOSE: _L.CLOSED,
    },
    _L.HANDSHAKING: {
        _E.HELLO_REPLY: _L.RESTORING,
        _E.LOST: _L.DISCONNECTED,
        _E.FAIL: _L.FAILED,
        _E.CLOSE: _L.CLOSED,
    },
    _L.RESTORING: {
        _E.RESTORED: _L.ACTIVE,
        _E.LOST: _L.DISCONNECTED,
        _E.FAIL: _L.FAILED,
        _E.CLOSE: _L.CLOSED,
    },
    _L.ACTIVE: {_E.LOST: _L.DISCONNECTED, _E.FAIL: _L.FAILED, _E.CLOSE: _L.CLOSED},
    _L.FAILED: {_E.CLOSE: _L.CLOSED},
    _L.CLOSED: {},
}
"""The link's legal transitions: ``LINK_TRANSITIONS[state][event]`` is the next state."""

CONNECTED_STATES: Final = (LinkState.RESTORING, LinkState.ACTIVE)
"""States in which the broker has answered Hello on the current connection.

Tuples, not sets, on purpose: they are tested on every post, and hashing an enum
member runs Python code (~150 ns) where a tuple compares identities in C."""

ENDED_STATES: Final = (LinkState.FAILED, LinkState.CLOSED)
"""States the session never leaves (but FAILED may still be closed)."""


class QueueState(enum.Enum):
    """Where one queue handle is in its life."""

    OPENING = "opening"  # first open not answered yet
    OPEN = "open"  # opened at least once and not closed (whatever the link)
    REOPENING = "reopening"  # reopen in flight after a reconnect
    CLOSING = "closing"  # close in flight
    ABANDONED = "abandoned"  # the application stopped waiting for its first open
    CLOSED = "closed"


class QueueEvent(enum.Enum):
    """What moves a queue handle."""

    OPEN_OK = "open_ok"  # the broker opened it (first open or reopen)
    REOPEN_SENT = "reopen_sent"  # a reconnect re-sent its open
    LINK_LOST = "link_lost"  # the link dropped with its reopen in flight
    CLOSE_SENT = "close_sent"  # a close is on the wire
    ABANDON = "abandon"  # the application gave up its first open while it is in flight
    FORGET = "forget"  # closed for good: locally, refused, or its close answered


_Q, _V = QueueState, QueueEvent

QUEUE_TRANSITIONS: Final[dict[QueueState, dict[QueueEvent, QueueState]]] = {
    _Q.OPENING: {_V.OPEN_OK: _Q.OPEN, _V.ABANDON: _Q.ABANDONED, _V.FORGET: _Q.CLOSED},
    _Q.OPEN: {_V.REOPEN_SENT: _Q.REOPENING, _V.CLOSE_SENT: _Q.CLOSING, _V.FORGET: _Q.CLOSED},
    _Q.REOPENING: {
        _V.OPEN_OK: _Q.OPEN,
        _V.LINK_LOST: _Q.OPEN,
        _V.CLOSE_SENT: _Q.CLOSING,
        _V.FORGET: _Q.CLOSED,
    },
    _Q.CLOSING: {_V.FORGET: _Q.CLOSED},
    _Q.ABANDONED: {_V.CLOSE_SENT: _Q.CLOSING, _V.FORGET: _Q.CLOSED},
    _Q.CLOSED: {_V.FORGET: _Q.CLOSED},
}
"""A queue handle's legal transitions: ``QUEUE_TRANSITIONS[state][event]``."""

WRITABLE_STATES: Final = (QueueState.OPEN, QueueState.REOPENING)
"""States in which a queue takes PUTs and CONFIRMs (buffered across a reopen)."""

LIVE_STATES: Final = (QueueState.OPENING, QueueState.OPEN, QueueState.REOPENING)
"""States in which the application may still configure or close the handle."""


def next_link_state(state: LinkState, event: LinkEvent) -> LinkState:
    """The link's state after ``event``; ``LocalProtocolError`` if it cannot happen."""
    try:
        return LINK_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(
            f"link event {event.value} is illegal in state {state.value}"
        ) from None


def next_queue_state(state: QueueState, event: QueueEvent) -> QueueState:
    """A queue's state after ``event``; ``LocalProtocolError`` if it cannot happen."""
    try:
        return QUEUE_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(
            f"queue event {event.value} is illegal in state {state.value}"
        ) from None


class LinkMachine:
    """The link's current state, changed only through ``LINK_TRANSITIONS``."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = LinkState.DISCONNECTED

    def apply(self, event: LinkEvent) -> LinkState:
        """Move on ``event``; return the new state."""
        self.state = next_link_state(self.state, event)
        return self.state

    @property
    def connected(self) -> bool:
        """True once the broker answered Hello on the current connection."""
        return self.state in CONNECTED_STATES

    @property
    def ended(self) -> bool:
        """True once the session failed or was closed."""
        return self.state in ENDED_STATES

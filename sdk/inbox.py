"""The synchronous message iterator: ``for message in queue.messages(timeout=...)``.

A queue opened with ``read=True`` and no ``on_message`` gets an ``Inbox``: the
dispatcher thread puts each PUSHed message in it, and ``queue.messages()`` takes
them out in the caller's thread. Its memory is bounded by the queue's flow limits:
the broker PUSHes a consumer only while it holds fewer than
``max_unconfirmed_messages`` messages and ``max_unconfirmed_bytes`` bytes, every
message in the inbox is unconfirmed, and when the connection drops the inbox is
emptied (those deliveries are stale: a CONFIRM of one would be dropped and the broker
redelivers them on the next connection), so the inbox never holds more than one
connection's worth of what the flow limits allow.

Iteration ends when the queue is closed (``queue.close()``, or a reopen the broker
refused), when the session is closed or fails, or when ``timeout`` seconds pass with
no message. The messages left in the inbox at that point are given back to the broker
with the queue or the session (they are never confirmed for you).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from holdfast.sdk.dispatch import lock_timeout
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.events import (
    ConnectionLost,
    QueueReopened,
    SessionClosed,
    SessionEvent,
    SessionFailed,
)
from holdfast.sdk.instrument import ItemSpans
from holdfast.sdk.state import QueueState
from holdfast.sdk.types import Message

if TYPE_CHECKING:
    from holdfast.sdk.queue_table import QueueRecord


class Inbox:
    """Messages PUSHed to one queue, waiting for its iterators. Thread-safe."""

    def __init__(self, traced: bool = False) -> None:
        self._ready = threading.Condition()
        self._messages: deque[Message] = deque()
        self._ended = False
        self.traced = traced
        """Its iterators give each item a ``process`` span (``holdfast.sdk.instrument``)."""

    def __len__(self) -> int:
        with self._ready:
            return len(self._messages)

    @property
    def ended(self) -> bool:
        """True once no message can come any more (queue or session closed)."""
        return self._ended

    def put(self, message: Message) -> None:
        """A PUSH arrived (the queue's ``on_message``, on the dispatcher thread)."""
        with self._ready:
            if self._ended:
                return  # the queue is closed: the broker has taken it back already
            self._messages.append(message)
            self._ready.notify()

    def clear(self) -> None:
        """The connection dropped: what was delivered on it is stale; forget it."""
        with self._ready:
            self._messages.clear()

    def end(self) -> None:
        """No message can come any more: wake every iterator, so that it ends."""
        with self._ready:
            self._ended = True
            self._messages.clear()
            self._ready.notify_all()

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (None: for ever); None
        if the inbox ended or nothing came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self._messages:
                if self._ended:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._ready.wait(lock_timeout(remaining))
            return self._messages.popleft()


def check_timeout(timeout: float | None) -> float | None:
    """``messages(timeout=...)``: None or a number of seconds >= 0."""
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        raise InvalidArgumentError(f"timeout must be None or seconds >= 0, got {timeout!r}")
    return timeout


def iterate(inbox: Inbox, timeout: float | None) -> Iterator[Message]:
    """Yield the inbox's messages until it ends or ``timeout`` passes without one."""
    if not inbox.traced:
        while (message := inbox.get(timeout)) is not None:
            yield message
        return
    spans = ItemSpans()
    try:
        while (message := inbox.get(timeout)) is not None:
            spans.next(message)
            yield message
    finally:
        spans.next(None)


class Inboxes:
    """Every inbox of one session, told what the session's events mean for them.

    The session routes each of its events here before the application's
    ``on_event``, on the dispatcher thread, so an inbox learns of a lost connection
    or a closed queue in order with the messages delivered before it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inboxes: weakref.WeakKeyDictionary[Inbox, QueueRecord] = weakref.WeakKeyDictionary()

    def add(self, inbox: Inbox, record: QueueRecord) -> None:
        """Track ``inbox``, the inbox of the queue ``record``."""
        with self._lock:
            self._inboxes[inbox] = record

    def end_all(self) -> None:
        """The session is over: end every iteration."""
        for inbox, _ in self._snapshot():
            inbox.end()

    def on_event(self, event: SessionEvent) -> None:
        """Apply one session event to the inboxes."""
        if isinstance(event, ConnectionLost):
            for inbox, _ in self._snapshot():
                inbox.clear()
        elif isinstance(event, SessionClosed | SessionFailed):
            self.end_all()
        elif isinstance(event, QueueReopened) and event.error is not None:
            for inbox, record in self._snapshot():
                if record.uri == event.queue_uri and record.state is QueueState.CLOSED:
                    inbox.end()

    def _snapshot(self) -> list[tuple[Inbox, QueueRecord]]:
        with self._lock:
            return list(self._inboxes.items())


__all__ = ["Inbox", "Inboxes", "check_timeout", "iterate"]

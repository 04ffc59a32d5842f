"""``CancelFlag``: ``Request.cancelled``, a ``threading.Event`` made only when waited on.

A worker makes a ``Request`` for every request it serves, and a handler rarely waits
on its cancellation: making a lock and a condition for every request was 5 % of an echo
worker's CPU (``bench/PROFILE.md``). The flag is a plain attribute until a handler calls
``wait``; a ``set()`` racing that first ``wait`` is never missed.
"""

from __future__ import annotations

import threading


class CancelFlag:
    """``Request.cancelled``: ``threading.Event``'s interface (``is_set``, ``wait``,
    ``set``), whose Event (a lock and a condition, 5 % of an echo worker's CPU when
    made for every request) is only made once a handler waits on it."""

    __slots__ = ("_event", "_flag")
    _making = threading.Lock()  # the Event is made once, and sees a set() before it

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """True once the call was cancelled."""
        return self._flag

    def set(self) -> None:
        """Cancel: wake every ``wait``."""
        with CancelFlag._making:
            self._flag = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; True if cancelled."""
        if self._flag:
            return True
        with CancelFlag._making:
            if self._event is None:
                self._event = threading.Event()
                if self._flag:
                    self._event.set()
            event = self._event
        return event.wait(timeout)

    def __repr__(self) -> str:
        return f"CancelFlag(set={self._flag})"


__all__ = ["CancelFlag"]

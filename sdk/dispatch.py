"""The dispatcher thread: runs application callbacks (ACKs, messages, events) in order.

Callbacks never run on the thread that reads the network, so a slow callback
delays other callbacks but never the link's liveness or its ACK processing. An
exception in a callback is logged and does not stop the dispatcher.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("holdfast.sdk.dispatch")

Callback = tuple[Callable[[Any], Any], Any]
_STOP = object()

YIELD_EVERY = 256
"""Callbacks run between two offers of the interpreter lock to the other threads.
A consumer's callbacks confirm messages; the sending thread can send those CONFIRMs
(and so the broker PUSH more) only once it gets the lock, which a busy dispatcher
hands over every 5 ms (``sys.getswitchinterval()``) otherwise. Measured with the
default window of 1,000 unconfirmed messages (100-B messages, memory store): PUSH ->
CONFIRM 76k msg/s direct and 53k through the proxy without the yield, 114-133k and
90-98k with it (64 a yield: 108-129k and 69-71k, the proxy then relays CONFIRM frames
a quarter the size)."""


def lock_timeout(seconds: float | None) -> float | None:
    """``seconds`` for a ``threading`` wait: None (no bound) past what a lock can time
    (``threading.TIMEOUT_MAX``), where a longer one raises ``OverflowError``; the
    waits loop on their own deadlines, so a caller's ``timeout=1e12`` or ``inf`` means
    as long as it takes."""
    if seconds is not None and seconds >= threading.TIMEOUT_MAX:
        return None
    return seconds


class Dispatcher:
    """A thread that runs batches of callbacks in submission order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, callbacks: list[Callback]) -> None:
        """Run these callbacks, in order, after everything submitted before."""
        if callbacks:
            self._queue.put(callbacks)

    def in_dispatcher(self) -> bool:
        """True when called from a callback (waiting on the dispatcher would deadlock)."""
        return threading.current_thread() is self._thread

    def barrier(self, timeout: float | None) -> bool:
        """Wait until every callback submitted so far has run; False on timeout."""
        if self.in_dispatcher():
            return True
        done = threading.Event()
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self._queue.put(done)
        if stopping:
            # Nothing runs after the stop (a closed session's flush()): what was
            # submitted has run once the thread has ended; a barrier queued behind the
            # stop would never be reached.
            self._thread.join(lock_timeout(timeout))
            return not self._thread.is_alive()
        return done.wait(lock_timeout(timeout))

    def stop(self, timeout: float | None) -> None:
        """Run what is queued, then stop the thread."""
        with self._lock:
            self._stopping = True
            self._queue.put(_STOP)
        if not self.in_dispatcher():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            for count, (function, argument) in enumerate(item, 1):
                try:
                    function(argument)
                except Exception:
                    log.exception("a Holdfast callback raised; continuing")
                if not count % YIELD_EVERY:
                    time.sleep(0)  # releases the lock: see YIELD_EVERY

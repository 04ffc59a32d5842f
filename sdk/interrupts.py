"""Ctrl-C held back while a closing session reports its pending PUTs: a
``KeyboardInterrupt`` in the middle would leave some of them unreported."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Deferred:
    """A Ctrl-C held back by ``interrupts_deferred``: ``interrupt`` once one came."""

    interrupt: KeyboardInterrupt | None = None


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[Deferred]:
    """Hold Ctrl-C while the session reports its pending PUTs (main thread only: the
    only one SIGINT reaches); it is raised once they are reported."""
    deferred = Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return

    def hold(signum: int, frame: object) -> None:
        deferred.interrupt = KeyboardInterrupt()

    try:
        previous = signal.signal(signal.SIGINT, hold)
    except ValueError:  # not the main interpreter
        yield deferred
        return
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


__all__ = ["Deferred", "interrupts_deferred"]

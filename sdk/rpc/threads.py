"""The handler threads of a threaded ``Worker``: ``concurrency`` threads taking jobs
from one queue.

``concurrent.futures.ThreadPoolExecutor`` made a ``Future`` (a lock and a condition)
per job and settled it after the job, for a result nobody reads: the worker posts
the reply itself. Here a job is a plain call put on a ``queue.SimpleQueue``, and a
thread that finishes one takes the next without sleeping while jobs wait.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("holdfast.sdk.rpc.worker")

_STOP = None


class HandlerThreads:
    """``concurrency`` daemon threads running submitted calls in arrival order."""

    def __init__(self, concurrency: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}_{index}", daemon=True)
            for index in range(concurrency)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on a free thread; ``RuntimeError`` once shut down
        (the caller leaves its request unconfirmed, to be redelivered)."""
        if self._closed:
            raise RuntimeError("the worker's threads are shut down")
        self._jobs.put((function, args))

    def shutdown(self, wait: bool) -> None:
        """Drop the jobs not started (their requests stay unconfirmed and go back to
        the queue when it closes) and stop the threads; with ``wait``, join them."""
        self._closed = True
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._jobs.put(_STOP)
        if wait and threading.current_thread() not in self._threads:
            for thread in self._threads:
                thread.join()

    def _run(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not _STOP:
            function, args = job
            try:
                function(*args)
            except Exception:  # a bug in a job must not take a handler thread with it
                log.exception("a request/reply job raised; continuing")

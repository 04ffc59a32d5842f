"""The threaded pump: drives a ``DriverCore`` with threads, for the synchronous ``Session``.

Threads, each with one job:

- the connector thread opens connections (failing over with back-off) and
  reads frames from the live one into the engine;
- the transport's sending thread (gRPC's request thread) pulls batched frames
  from ``_outbound``, which also runs the engine's timers while it waits;
- the dispatcher thread (given by the front-end) runs callbacks in order.

Everything touching the engine holds ``lock``; the front-end takes it too, so
``post()`` stays a lock and an append. Any exception in the connector thread
ends the connection (see ``holdfast.sdk.driver.core``), never the thread: a
failure outside any connection fails the session, so nobody waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from holdfast.sdk.dispatch import Dispatcher, lock_timeout
from holdfast.sdk.driver.core import CLOSE_DRAIN_TIMEOUT, DriverCore
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.transports.base import SyncConnection, SyncTransport

log = logging.getLogger("holdfast.sdk.driver")


class _Live:
    """Whether one connection is still the current one (read by its sending thread)."""

    __slots__ = ("closed", "error")

    def __init__(self) -> None:
        self.closed = False
        self.error: BaseException | None = None
        """What broke the sending side, if something did (it ends the connection)."""


class ThreadDriver:
    """Runs one engine's connections on a connector thread."""

    def __init__(
        self,
        engine: SessionEngine,
        addresses: list[str],
        options: SessionOptions,
        transport: SyncTransport,
        dispatcher: Dispatcher,
    ) -> None:
        self.engine = engine
        self.core = DriverCore(engine, addresses, options, log)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        """Notified after every input: flush, the high watermark and requests wait on it."""
        self.writer_idle = False
        self._writer_wakeup = threading.Condition(self.lock)
        self._transport = transport
        self._dispatcher = dispatcher
        self._results: dict[int, HoldfastError | None] = {}
        self._waiting: set[int] = set()
        self._connection: SyncConnection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="holdfast-connector", daemon=True)

    def start(self) -> None:
        """Start connecting."""
        self._thread.start()

    # ---------------------------------------------------- used by the front-end (lock held)

    def wake_writer(self) -> None:
        """Wake the idle writer. It is marked busy at once, so posts made before it gets
        the lock back do not each notify it again (a notify costs ~0.5 us of Python)."""
        self.writer_idle = False
        # All: the writer of a connection that just ended may wait beside the current one.
        self._writer_wakeup.notify_all()

    def wait_admission(self, now: float, queue_id: int) -> float:
        """Rule 7: hold the caller while the engine says the transport (or the broker,
        for this queue) pushes back; the time after the wait (``BandwidthLimitError``
        or ``BrokerBusyError`` after 5 s, from the engine)."""
        since = now
        self.engine.note_admission_wait(queue_id)
        while (delay := self.engine.admit_post(since, now, queue_id)) > 0:
            self.changed.wait(delay)
            now = time.monotonic()
        return now

    def expect(self, request_id: int) -> None:
        """Keep the outcome of this request for ``wait_request``."""
        self._waiting.add(request_id)

    def after_input(self) -> None:
        """Move the engine's outputs to where they go."""
        engine = self.engine
        self._dispatcher.submit(engine.take_callbacks())
        for request_id, error in engine.take_completions():
            if request_id in self._waiting:
                self._results[request_id] = error
        # A timer the input started (a pushed-back PUT's retry) must be waited by a
        # writer that went idle before it existed: wake it to take the new deadline.
        if self.writer_idle and (engine.has_outbound or engine.next_deadline() is not None):
            self.wake_writer()
        self.changed.notify_all()

    # ---------------------------------------------------- used by the front-end (lock free)

    def wait_request(self, request_id: int, timeout: float, what: str) -> None:
        """Wait for an expected request; raise its error, or ``RequestTimeoutError``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while request_id not in self._results:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._waiting.discard(request_id)
                    raise self.core.timed_out(what, timeout)
                self.changed.wait(lock_timeout(remaining))
            error = self._results.pop(request_id)
            self._waiting.discard(request_id)
        if error is not None:
            raise error

    def stop(self) -> None:
        """End the stream after what is queued, close the engine, stop the threads."""
        in_connector = threading.current_thread() is self._thread
        with self.lock:
            # The writer sends what is queued (CONFIRMs issued before close()) and
            # ends the stream; the broker reads all of it before it sees the end.
            # Cancelling instead could discard frames it had not read yet.
            self.core.begin_stop()
            self._stop.set()
            self._writer_wakeup.notify_all()
        if not in_connector:
            self._thread.join(CLOSE_DRAIN_TIMEOUT)
        with self.lock:
            self.engine.close()
            self.after_input()
            connection = self._connection
        if connection is not None:
            connection.close()
        if not in_connector:
            self._thread.join(10)

    # ------------------------------------------------------------------ the connector thread

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    address = self.core.begin(time.monotonic())
                    self.after_input()
                if address is None:
                    return
                delay = self._run_connection(address, self.core.generation)
                if delay is None:
                    return
                self._back_off(delay)
        except Exception as exc:  # a bug here must fail the session, not hang it
            with self.lock:
                self.core.fail(exc)
                self.after_input()

    def _back_off(self, delay: float) -> None:
        deadline = time.monotonic() + delay
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            with self.lock:
                ticked, timer = self.core.run_timers(now)
                if ticked:
                    self.after_input()
            self._stop.wait(deadline - now if timer is None else min(deadline - now, timer))

    def _run_connection(self, address: str, generation: int) -> float | None:
        """Run one connection until it ends; the back-off before the next, or None to stop."""
        live = _Live()
        error: BaseException | None = None
        connection: SyncConnection | None = None
        hello_timer: threading.Timer | None = None
        try:
            connection = self._transport.connect(address, self._outbound(live, generation))
            with self.lock:
                self._connection = connection
                remaining = self.core.hello_remaining(time.monotonic())
            if remaining is not None:
                hello_timer = threading.Timer(remaining, self._expire_hello, (connection,))
                hello_timer.daemon = True
                hello_timer.start()
            for data in connection:
                with self.lock:
                    self.core.receive(generation, data, time.monotonic())
                    self.after_input()
        except Exception as exc:
            error = exc
        finally:
            if hello_timer is not None:
                hello_timer.cancel()
            if connection is not None:
                connection.close()
            with self.lock:
                live.closed = True
                self._connection = None
                delay = self.core.ended(live.error or error)
                self.after_input()
                self._writer_wakeup.notify_all()
        return delay

    def _expire_hello(self, connection: SyncConnection) -> None:
        with self.lock:
            if self.core.established:
                return
            self.core.expire_hello()
        connection.close()

    def _outbound(self, live: _Live, generation: int) -> Iterator[bytes]:
        """The frames the transport pulls: everything queued since the last pull, batched.

        gRPC asks for the next frame only once the previous one is sent, so while
        it waits on flow control PUTs pile up in the engine, count against the
        high watermark, and leave together in the next batch.
        """
        try:
            yield from self._pull(live, generation)
        except Exception as exc:  # ends this connection, not the transport's thread
            with self.lock:
                live.error = exc
                connection = self._connection
            if connection is not None:
                connection.close()

    def _pull(self, live: _Live, generation: int) -> Iterator[bytes]:
        engine = self.engine
        while True:
            with self.lock:
                while not (engine.has_outbound or live.closed or self.core.stopping):
                    self.writer_idle = True
                    ticked, timer = self.core.run_timers(time.monotonic())
                    if ticked:
                        self.after_input()
                    if not engine.has_outbound:
                        self._writer_wakeup.wait(timer)
                if live.closed or engine.generation != generation:
                    # An ended connection's writer: the idle flag is the current writer's.
                    return
                self.writer_idle = False
                if not engine.has_outbound:
                    return  # the end of the request stream: a half-close when stopping
                items = engine.take_outbound()
            for frame, nbytes in self.core.frames(items, time.monotonic()):
                yield frame
                with self.lock:
                    engine.transport_drained(nbytes)
                    self.changed.notify_all()

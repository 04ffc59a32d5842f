"""Keyed worker pools: how a pool's queues are named, and the worker side.

A pool is ``hf://<domain>/<pool>``. A request for key ``k``
(``session.request("hf://<domain>/<pool>", payload, key="k")``) goes to the key's own
request queue (``PoolNames.key_queue``, in ``holdfast.sdk.poolnames``). While no
worker group serves the key,
the broker redirects those requests to the pool's orphan queue (a policy template
the pool manager sets), and the manager starts a group and forwards them
(``holdfast.pool``).

A worker program is a few lines::

    from holdfast.sdk.pool import serve

    def handle(request):
        return b"done: " + request.payload

    serve(handle)

``serve`` reads ``WORKER_ID``, ``WORKER_KEY``, ``WORKER_POOL`` and
``WORKER_REQUESTS_QUEUE`` (set by the manager's ``subprocess`` driver, or by hand with
the ``noop`` driver) and ``$HOLDFAST_ADDRESS``, reports ``started`` and
``request-received`` activity to the pool's activity queue (which keeps its group
alive), and serves until SIGTERM or SIGINT.

``started`` is posted, and its ACK awaited, before the first request is taken: the
manager tells a worker that could not start (its callers are failed at once, with
its exit status and stderr) from one that crashed on a request (redelivered).

With ``WORKER_PROCESSING_TIMEOUT`` (the pool's ``--processing-timeout``), a watchdog
thread ends the process with ``PROCESSING_TIMEOUT_EXIT`` when a handler runs longer:
the broker gives the request back with its delivery count risen (so the pool's
delivery limit still ends a request that always hangs) and the manager starts a
fresh worker. A thread cannot be stopped in Python, and a hung handler may hold
locks: ending the process is the only safe way out. (A hang inside C code that
never releases the GIL stops the watchdog too; nothing in-process can catch that.
So, with a processing timeout, a thread of its own also reports ``alive`` every
``alive_interval`` of it, announced in the ``started`` report: the manager kills and
replaces a worker that falls silent for longer than the timeout.)

With ``WORKER_LIFELINE_FD`` (the ``subprocess`` driver sets it), ``serve`` ends the
process when that pipe reaches end-of-file, that is once its manager is gone: a
worker run by a wrapper script, which the manager's parent-death signal does not
reach, does not outlive a manager killed with ``kill -9``.

A pool worker holds only the requests it runs (``unprefetched``): the broker counts
every delivery, and a crash returns every request its process held. With a
prefetch, a request that had finished just before a poison one (its CONFIRM, sent
once its reply is ACKed, not yet at the broker) and one waiting for a thread went
back with their counts risen at each crash: the poison request took its innocent
neighbours to ``<pool>.poison``, and re-ran the finished one's handler. Without
one, the broker pushes a key's next request only once it has the CONFIRM of the
last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from holdfast.sdk.errors import HoldfastError, InvalidArgumentError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.poolnames import (
    ACTIVITY_ALIVE_MS,
    ACTIVITY_EVENT,
    ACTIVITY_KEY,
    ACTIVITY_WORKER,
    ALIVE,
    ENVIRONMENT,
    LIFELINE_FD,
    MANAGER_GONE_EXIT,
    MAX_KEY_BYTES,
    PROCESSING_TIMEOUT,
    PROCESSING_TIMEOUT_EXIT,
    REQUEST_RECEIVED,
    STARTED,
    PoolNames,
    alive_interval,
    check_key,
    key_queue_uri,
)
from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.values import Request
from holdfast.sdk.rpc.worker import HandlerResult, Worker
from holdfast.sdk.session import Session

log = logging.getLogger(__name__)

STARTED_ACK_TIMEOUT = 30.0
"""Seconds ``serve`` waits for the broker to take its ``started`` report."""


def serve(
    handler: Callable[[Request], HandlerResult],
    *,
    concurrency: int = 1,
    options: WorkerOptions | None = None,
    environ: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve the pool key this process was started for until SIGTERM/SIGINT (or until
    ``stop`` is set, for callers that run it on a thread of their own).
    ``options.extra_requests`` must be unset or 0 (``unprefetched``)."""
    env = os.environ if environ is None else environ
    missing = [name for name in ENVIRONMENT if not env.get(name)]
    if missing:
        raise InvalidArgumentError(
            f"not started as a pool worker: {', '.join(missing)} not set "
            "(holdfast-pool sets them; with --driver noop set them by hand)"
        )
    names = PoolNames.of(env["WORKER_POOL"])
    options = unprefetched(options)
    key, worker_id, queue = env["WORKER_KEY"], env["WORKER_ID"], env["WORKER_REQUESTS_QUEUE"]
    watchdog = Watchdog(_timeout(env.get(PROCESSING_TIMEOUT)), _exit_for_timeout)
    watch_lifeline(env.get(LIFELINE_FD))  # first: a manager gone meanwhile ends us now
    stop = stop or _stop_on_signals()
    link = SessionOptions(
        token=env.get("HOLDFAST_TOKEN") or None, tls_ca=env.get("HOLDFAST_TLS_CA") or None
    )
    with Session(env.get("HOLDFAST_ADDRESS") or None, options=link) as session:
        activity = session.open_queue(names.activity, write=True)

        beat = alive_interval(watchdog.timeout) if watchdog.timeout is not None else None

        def report(event: str) -> None:
            properties = {ACTIVITY_EVENT: event, ACTIVITY_KEY: key, ACTIVITY_WORKER: worker_id}
            if event == STARTED and beat is not None:  # the manager may judge our silence
                properties[ACTIVITY_ALIVE_MS] = str(max(1, round(beat * 1000)))
            with contextlib.suppress(HoldfastError):  # activity is advisory
                activity.post(b"", properties)

        def handle(request: Request) -> HandlerResult:
            report(REQUEST_RECEIVED)
            with watchdog.watching(request):
                return handler(request)

        report(STARTED)
        session.flush(STARTED_ACK_TIMEOUT)
        watchdog.start()
        if beat is not None:
            # Its own thread, Python code: a process frozen whole (SIGSTOP, a debugger)
            # or a handler holding the GIL in C stops it, and the manager replaces us.
            heart = threading.Thread(
                target=_beat, args=(report, beat, stop), name="holdfast-pool-alive", daemon=True
            )
            heart.start()
        with Worker(session, queue, handle, concurrency=concurrency, options=options):
            log.info("worker %s serving key %r of %s on %s", worker_id, key, names.uri, queue)
            stop.wait()
        watchdog.stop()


def unprefetched(options: WorkerOptions | None) -> WorkerOptions:
    """``options`` with ``extra_requests=0``: a pool worker holds only the requests it
    runs, so a crash returns no request that did not run beside it (see the module's
    docstring). ``InvalidArgumentError`` for ``extra_requests`` above 0."""
    options = options or WorkerOptions()
    if options.extra_requests:
        raise InvalidArgumentError(
            "a pool worker takes no extra_requests: a request held for a thread would "
            "count a delivery at each crash of another request and end in the poison queue"
        )
    return dataclasses.replace(options, extra_requests=0)


class Watchdog:
    """Calls ``expire(request, seconds)`` when a handler runs past ``timeout``
    (nothing when ``timeout`` is None)."""

    def __init__(self, timeout: float | None, expire: Callable[[Request, float], None]) -> None:
        self.timeout = timeout
        self._expire = expire
        self._running: dict[int, tuple[float, Request]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="holdfast-pool-watchdog")
        self._thread.daemon = True

    def start(self) -> None:
        """Start watching (a no-op without a timeout)."""
        if self.timeout is not None:
            self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stopped.set()

    @contextlib.contextmanager
    def watching(self, request: Request) -> Iterator[None]:
        """Time the handler run inside the ``with`` block."""
        ident = threading.get_ident()
        with self._lock:
            self._running[ident] = (time.monotonic(), request)
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(ident, None)

    def overdue(self, now: float) -> tuple[Request, float] | None:
        """The request that has run longest past the timeout, and for how long."""
        if self.timeout is None:
            return None
        with self._lock:
            runs = list(self._running.values())
        for started, request in sorted(runs, key=lambda run: run[0]):
            if now - started > self.timeout:
                return request, now - started
        return None

    def _watch(self) -> None:
        assert self.timeout is not None
        tick = min(1.0, max(0.01, self.timeout / 4))
        while not self._stopped.wait(tick):
            late = self.overdue(time.monotonic())
            if late is not None:
                self._expire(*late)


def _beat(report: Callable[[str], None], interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        report(ALIVE)


def watch_lifeline(raw: str | None) -> None:
    """End this process when its manager is gone: ``raw`` (``WORKER_LIFELINE_FD``)
    names the read end of a pipe whose write end only the manager holds, and a read
    there returns end-of-file once the manager is gone, however it died (``kill -9``
    included, where the parent-death signal reaches only the process the manager
    started, not a wrapper script's children). Nothing without it (a worker started
    by hand)."""
    if not raw:
        return
    try:
        fd = int(raw)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(f"descriptor {fd} is not a pipe")
        os.set_inheritable(fd, False)  # the worker's own children are not watched
    except (ValueError, OSError) as error:
        log.warning("%s=%r cannot be watched (%s)", LIFELINE_FD, raw[:32], error)
        return
    threading.Thread(
        target=_lifeline, args=(fd,), name="holdfast-pool-lifeline", daemon=True
    ).start()


def _lifeline(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass  # the manager writes nothing: only the end of the pipe matters
    except OSError as error:  # closed under us: the manager's death cannot be seen
        log.warning("the lifeline pipe cannot be read (%s): not watched", error)
        return
    log.error(
        "the pool manager is gone: this worker exits (status %d) so that a restarted "
        "manager never finds a second worker for its key",
        MANAGER_GONE_EXIT,
    )
    logging.shutdown()
    os._exit(MANAGER_GONE_EXIT)


def _timeout(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        timeout = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"{PROCESSING_TIMEOUT} is not a number: {raw[:32]!r}") from None
    if not timeout > 0:
        raise InvalidArgumentError(f"{PROCESSING_TIMEOUT} must be > 0 seconds, got {raw[:32]!r}")
    return timeout


def _exit_for_timeout(request: Request, seconds: float) -> None:
    log.error(
        "request %s has run %.1f s, past the processing timeout: this worker exits "
        "(status %d) so that the request goes back to the broker and a fresh worker "
        "takes over",
        request.guid,
        seconds,
        PROCESSING_TIMEOUT_EXIT,
    )
    logging.shutdown()
    os._exit(PROCESSING_TIMEOUT_EXIT)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return stop


__all__ = [
    "ENVIRONMENT",
    "MAX_KEY_BYTES",
    "PoolNames",
    "Watchdog",
    "check_key",
    "key_queue_uri",
    "serve",
    "watch_lifeline",
]

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
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping

from holdfast.sdk.errors import HoldfastError, InvalidArgumentError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.poolnames import (
    ACTIVITY_EVENT,
    ACTIVITY_KEY,
    ACTIVITY_WORKER,
    ENVIRONMENT,
    MAX_KEY_BYTES,
    REQUEST_RECEIVED,
    STARTED,
    PoolNames,
    check_key,
    key_queue_uri,
)
from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.values import Request
from holdfast.sdk.rpc.worker import HandlerResult, Worker
from holdfast.sdk.session import Session

log = logging.getLogger(__name__)


def serve(
    handler: Callable[[Request], HandlerResult],
    *,
    concurrency: int = 1,
    options: WorkerOptions | None = None,
    environ: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve the pool key this process was started for until SIGTERM/SIGINT (or until
    ``stop`` is set, for callers that run it on a thread of their own)."""
    env = os.environ if environ is None else environ
    missing = [name for name in ENVIRONMENT if not env.get(name)]
    if missing:
        raise InvalidArgumentError(
            f"not started as a pool worker: {', '.join(missing)} not set "
            "(holdfast-pool sets them; with --driver noop set them by hand)"
        )
    names = PoolNames.of(env["WORKER_POOL"])
    key, worker_id, queue = env["WORKER_KEY"], env["WORKER_ID"], env["WORKER_REQUESTS_QUEUE"]
    stop = stop or _stop_on_signals()
    link = SessionOptions(
        token=env.get("HOLDFAST_TOKEN") or None, tls_ca=env.get("HOLDFAST_TLS_CA") or None
    )
    with Session(env.get("HOLDFAST_ADDRESS") or None, options=link) as session:
        activity = session.open_queue(names.activity, write=True)

        def report(event: str) -> None:
            properties = {ACTIVITY_EVENT: event, ACTIVITY_KEY: key, ACTIVITY_WORKER: worker_id}
            with contextlib.suppress(HoldfastError):  # activity is advisory
                activity.post(b"", properties)

        def handle(request: Request) -> HandlerResult:
            report(REQUEST_RECEIVED)
            return handler(request)

        with Worker(session, queue, handle, concurrency=concurrency, options=options):
            report(STARTED)
            log.info("worker %s serving key %r of %s on %s", worker_id, key, names.uri, queue)
            stop.wait()


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
    "check_key",
    "key_queue_uri",
    "serve",
]

"""A pool worker for the tests: ``python -m tests.pools.worker_main``.

Replies ``<WORKER_KEY>|<WORKER_ID>|<pid>|<payload>``; a request whose payload is
``crash`` kills the process (``os._exit``), as a worker with a fatal bug would; one
whose payload is ``stall-once:<path>`` hangs forever (a deadlock) unless ``<path>``
exists, which it creates first with its PID, so its redelivery is served; one
whose payload is ``nap`` takes 50 ms, as real work would.

With ``POOL_TEST_RUNS`` set, each handler run appends ``<pid> <delivery count>
<payload>`` to the file it names, first thing: a test counts the runs of a request.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from holdfast.sdk import Request
from holdfast.sdk.pool import serve

RUNS = "POOL_TEST_RUNS"


def handle(request: Request) -> bytes:
    """Answer who served the request, or die on ``crash``."""
    runs = os.environ.get(RUNS)
    if runs:
        with open(runs, "a") as log:
            log.write(f"{os.getpid()} {request.delivery_count} {request.payload.decode()}\n")
    if request.payload == b"nap":
        time.sleep(0.05)
    if request.payload == b"crash":
        os._exit(3)
    if request.payload.startswith(b"stall-once:"):
        marker = Path(request.payload.split(b":", 1)[1].decode())
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            threading.Event().wait()  # never set: a handler that hangs
    who = f"{os.environ['WORKER_KEY']}|{os.environ['WORKER_ID']}|{os.getpid()}|"
    return who.encode() + request.payload


if __name__ == "__main__":
    serve(handle)

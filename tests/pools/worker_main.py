"""A pool worker for the tests: ``python -m tests.pools.worker_main``.

Replies ``<WORKER_KEY>|<WORKER_ID>|<pid>|<payload>``; a request whose payload is
``crash`` kills the process (``os._exit``), as a worker with a fatal bug would; one
whose payload is ``stall-once:<path>`` hangs forever (a deadlock) unless ``<path>``
exists, which it creates first with its PID, so its redelivery is served.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from holdfast.sdk import Request
from holdfast.sdk.pool import serve


def handle(request: Request) -> bytes:
    """Answer who served the request, or die on ``crash``."""
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

"""A pool worker for the tests: ``python -m tests.pools.worker_main``.

Replies ``<WORKER_KEY>|<WORKER_ID>|<pid>|<payload>``; a request whose payload is
``crash`` kills the process (``os._exit``), as a worker with a fatal bug would.
"""

from __future__ import annotations

import os

from holdfast.sdk import Request
from holdfast.sdk.pool import serve


def handle(request: Request) -> bytes:
    """Answer who served the request, or die on ``crash``."""
    if request.payload == b"crash":
        os._exit(3)
    who = f"{os.environ['WORKER_KEY']}|{os.environ['WORKER_ID']}|{os.getpid()}|"
    return who.encode() + request.payload


if __name__ == "__main__":
    serve(handle)

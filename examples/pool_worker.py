"""A worker of a keyed worker pool, started by ``holdfast-pool`` for one key.

    holdfast-pool --address 127.0.0.1:7700 --pool hf://infra/sim \\
                  --worker-command "python examples/pool_worker.py"

Each worker process serves one key (``WORKER_KEY``) and answers with it.
"""

from __future__ import annotations

import logging
import os

from holdfast.sdk import Request
from holdfast.sdk.pool import serve


def simulate(request: Request) -> bytes:
    """Answer a request for this worker's key."""
    return f"simulated {request.payload.decode()} for {os.environ['WORKER_KEY']}".encode()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    serve(simulate)

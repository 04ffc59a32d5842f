"""A worker process for request/reply tests, started and killed by PID.

``python -m tests.rpc.worker_main ADDRESS URI LOG [--sleep S]``: serves ``URI``;
each handler run appends ``start <request guid> <pid>`` to ``LOG`` (flushed at
once) and, after sleeping, replies ``<payload>|<pid>``. Prints ``ready`` once the
worker consumes the queue.
"""

from __future__ import annotations

import argparse
import os
import threading

from holdfast.sdk import Request, Session, Worker
from tests.support.sessions import FAST


def main() -> None:
    """Run the worker until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("uri")
    parser.add_argument("log")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    pid = os.getpid()

    def handle(request: Request) -> bytes:
        with open(args.log, "a") as log:
            log.write(f"start {request.guid} {pid}\n")
        request.cancelled.wait(args.sleep)
        return request.payload + f"|{pid}".encode()

    with Session(args.address, options=FAST) as session, Worker(session, args.uri, handle):
        print("ready", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()

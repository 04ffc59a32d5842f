"""A worker process for request/reply tests, started and killed by PID.

``python -m tests.rpc.worker_main ADDRESS URI LOG [--sleep S] [--aio]``: serves ``URI``
(with the asyncio ``Worker`` under ``--aio``); each handler run appends ``start
<request guid> <pid>`` to ``LOG`` (flushed at once) and, after sleeping, replies
``<payload>|<pid>``. Prints ``ready`` once the worker consumes the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading

from holdfast.sdk import Request, Session, Worker, aio
from tests.support.sessions import FAST


def main() -> None:
    """Run the worker until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("uri")
    parser.add_argument("log")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--aio", action="store_true")
    args = parser.parse_args()
    pid = os.getpid()

    def log(request: Request) -> None:
        with open(args.log, "a") as file:
            file.write(f"start {request.guid} {pid}\n")

    def handle(request: Request) -> bytes:
        log(request)
        request.cancelled.wait(args.sleep)
        return request.payload + f"|{pid}".encode()

    async def handle_async(request: Request) -> bytes:
        log(request)
        await asyncio.sleep(args.sleep)  # a cancel cancels this task
        return request.payload + f"|{pid}".encode()

    async def serve() -> None:
        async with (
            aio.Session(args.address, options=FAST) as session,
            aio.Worker(session, args.uri, handle_async),
        ):
            print("ready", flush=True)
            await asyncio.Event().wait()

    if args.aio:
        asyncio.run(serve())
        return
    with Session(args.address, options=FAST) as session, Worker(session, args.uri, handle):
        print("ready", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()

"""A caller process for request/reply tests, killed by PID to play a caller that goes away.

``python -m tests.rpc.caller_main ADDRESS URI [--aio]``: prints ``calling`` and makes
one call with a long timeout (on the asyncio session under ``--aio``).
"""

from __future__ import annotations

import argparse
import asyncio

from holdfast.sdk import Session, aio
from tests.support.sessions import FAST


def main() -> None:
    """Call once; print the reply's payload."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("uri")
    parser.add_argument("--aio", action="store_true")
    args = parser.parse_args()
    payload = b"from a caller that will die"

    async def call() -> None:
        async with aio.Session(args.address, options=FAST) as session:
            task = asyncio.create_task(session.request(args.uri, payload, timeout=120))
            print("calling", flush=True)
            print((await task).payload, flush=True)

    if args.aio:
        asyncio.run(call())
        return
    with Session(args.address, options=FAST) as session:
        future = session.request_async(args.uri, payload, timeout=120)
        print("calling", flush=True)
        print(future.result().payload, flush=True)


if __name__ == "__main__":
    main()

"""A process for durable request tests, killed by PID to play a caller that restarts.

``python -m tests.rpc.durable_main ADDRESS post URI PAYLOAD``: posts a durable request,
prints its request id and waits to be killed.
``python -m tests.rpc.durable_main ADDRESS fetch REQUEST_ID``: fetches its reply and
prints ``reply <payload>`` (or ``error <type>``).
"""

from __future__ import annotations

import argparse
import threading

from holdfast.sdk import RpcError, Session
from tests.support.sessions import FAST


def main() -> None:
    """Post or fetch once."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("mode", choices=["post", "fetch"])
    parser.add_argument("args", nargs="+")
    args = parser.parse_args()
    with Session(args.address, options=FAST) as session:
        if args.mode == "post":
            uri, payload = args.args
            print(session.request_durable(uri, payload.encode(), keep=120), flush=True)
            threading.Event().wait()  # until killed
        try:
            reply = session.fetch_reply(args.args[0], timeout=30)
        except RpcError as error:
            print("error", type(error).__name__, flush=True)
        else:
            print("reply", reply.payload.decode(), flush=True)


if __name__ == "__main__":
    main()

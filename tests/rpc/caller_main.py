"""A caller process for request/reply tests, killed by PID to play a caller that goes away.

``python -m tests.rpc.caller_main ADDRESS URI``: prints ``calling`` and makes one call
with a long timeout.
"""

from __future__ import annotations

import argparse

from holdfast.sdk import Session
from tests.support.sessions import FAST


def main() -> None:
    """Call once; print the reply's payload."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("uri")
    args = parser.parse_args()
    with Session(args.address, options=FAST) as session:
        future = session.request_async(args.uri, b"from a caller that will die", timeout=120)
        print("calling", flush=True)
        print(future.result().payload, flush=True)


if __name__ == "__main__":
    main()

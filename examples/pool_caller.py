"""A caller of the keyed worker pool of ``pool_worker.py``.

    python examples/pool_caller.py --address 127.0.0.1:7700 --pool hf://infra/sim

Each key gets a worker group of its own, started on its first request.
"""

from __future__ import annotations

import argparse
import logging

from holdfast.sdk import Session


def main() -> None:
    """Call the pool for three keys and print the replies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS")
    parser.add_argument("--pool", default="hf://infra/sim")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with Session(args.address) as session:
        for infra in ("42", "43", "42"):
            reply = session.request(args.pool, b"a train", key=infra, timeout=60)
            print(reply.payload.decode())


if __name__ == "__main__":
    main()

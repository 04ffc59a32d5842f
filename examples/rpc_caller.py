"""A request/reply caller of the price-quote service of ``rpc_worker.py``.

    python examples/rpc_caller.py --address 127.0.0.1:7701 --service hf://demo/quotes

Asks whether the service has workers, makes a blocking call, a batch of concurrent
calls, and shows the typed errors: a handler's exception, and a call that no worker
picks up in time.
"""

from __future__ import annotations

import argparse
import json
import logging

from holdfast.sdk import DeadLetteredError, RemoteHandlerError, Session


def order(item: str, quantity: int) -> bytes:
    """A request payload."""
    return json.dumps({"item": item, "quantity": quantity}).encode()


def main() -> None:
    """Call the service and print what came back."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS")
    parser.add_argument("--service", default="hf://demo/quotes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with Session(args.address) as session:
        print(f"has workers: {session.has_workers(args.service)}")

        reply = session.request(args.service, order("widget", 3), timeout=10)
        print(f"widget x3: {json.loads(reply.payload)} {dict(reply.properties)}")

        futures = [
            session.request_async(args.service, order("gadget", n), timeout=10)
            for n in range(1, 11)
        ]
        totals = [json.loads(f.result().payload)["total"] for f in futures]
        print(f"gadget x1..x10: {totals}")

        try:
            session.request(args.service, order("gizmo", 1), timeout=10)
        except RemoteHandlerError as error:
            print(f"gizmo: {error.error_type}: {error.message}")

        try:
            session.request("hf://demo/nobody-serves-this", b"{}", timeout=5, pickup_timeout=0.5)
        except DeadLetteredError as error:
            print(f"unserved: dead-lettered, reason {error.reason}")


if __name__ == "__main__":
    main()

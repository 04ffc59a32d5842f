"""A request/reply worker: a price-quote service on a queue.

    python examples/rpc_worker.py --address 127.0.0.1:7701 --service hf://demo/quotes

Each request is JSON ``{"item": ..., "quantity": ...}``; the reply is JSON with the
total. An unknown item raises, and the caller receives a ``RemoteHandlerError``. Runs
until SIGTERM or Ctrl-C; requests it was running when stopped are redelivered to
another worker (with one reply per call either way).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading

from holdfast.sdk import Request, Session, Worker

PRICES = {"widget": 2.50, "gadget": 10.00}


def quote(request: Request) -> tuple[bytes, dict[str, str]]:
    """Price one order; a handler may take its time, and stops early if cancelled."""
    order = json.loads(request.payload)
    if order["item"] not in PRICES:
        raise ValueError(f"unknown item {order['item']!r}")
    if request.cancelled.wait(float(order.get("think", 0))):
        return b"", {}  # the caller gave up: this reply is dropped anyway
    total = PRICES[order["item"]] * int(order["quantity"])
    return json.dumps({"total": total}).encode(), {"currency": "EUR"}


def main() -> None:
    """Serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS")
    parser.add_argument("--service", default="hf://demo/quotes")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    with (
        Session(args.address) as session,
        Worker(session, args.service, quote, concurrency=args.concurrency),
    ):
        print(f"serving {args.service}", flush=True)
        stop.wait()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()

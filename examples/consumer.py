"""Consume messages from a queue, confirm each one, and stop when the queue goes quiet.

    python examples/consumer.py --address 127.0.0.1:7701 --queue hf://demo/orders

Prints how many messages arrived, how many were redeliveries (delivery_count > 1)
and how many distinct GUIDs that makes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid

from holdfast.sdk import Message, QueueOptions, Session


class Consumer:
    """Confirms every message and remembers what it saw."""

    def __init__(self) -> None:
        self.guids: set[uuid.UUID] = set()
        self.deliveries = 0
        self.redeliveries = 0
        self.last_seen = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.deliveries += 1
            self.redeliveries += message.delivery_count > 1
            self.guids.add(message.guid)
            self.last_seen = time.monotonic()
        message.confirm()


def consume(address: str | None, uri: str, idle: float, expect: int | None = None) -> Consumer:
    """Consume until ``expect`` distinct messages arrived (if given) and ``idle`` seconds
    passed without a new one."""
    consumer = Consumer()
    with Session(address) as session:
        session.open_queue(
            uri,
            read=True,
            on_message=consumer,
            options=QueueOptions(max_unconfirmed_messages=2000),
        )
        while True:
            time.sleep(0.1)
            quiet = time.monotonic() - consumer.last_seen > idle
            if quiet and (expect is None or len(consumer.guids) >= expect):
                break
    return consumer


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS or :7701")
    parser.add_argument("--queue", default="hf://demo/orders")
    parser.add_argument("--idle", type=float, default=2.0, help="stop after this quiet time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    consumer = consume(args.address, args.queue, args.idle)
    print(
        f"deliveries={consumer.deliveries} distinct={len(consumer.guids)} "
        f"redeliveries={consumer.redeliveries}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

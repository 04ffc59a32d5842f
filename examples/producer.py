"""Post messages to a queue and account for every ACK.

    python examples/producer.py --address 127.0.0.1:7701 --queue hf://demo/orders --count 10000

Every PUT gets exactly one ACK. The producer prints how many succeeded, how many
ended UNKNOWN (may or may not be in the queue) and how many failed, and exits 1
unless every PUT succeeded.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections import Counter

from holdfast.sdk import Ack, AckStatus, Session


class AckTally:
    """Counts ACKs by status; safe to use as an ``on_ack`` callback."""

    def __init__(self) -> None:
        self.by_status: Counter[AckStatus] = Counter()
        self._lock = threading.Lock()

    def __call__(self, ack: Ack) -> None:
        with self._lock:
            self.by_status[ack.status] += 1

    def total(self) -> int:
        """ACKs received so far."""
        with self._lock:
            return sum(self.by_status.values())


def produce(address: str | None, uri: str, count: int, size: int) -> AckTally:
    """Post ``count`` messages of ``size`` bytes and wait for all their ACKs."""
    tally = AckTally()
    with Session(address) as session:
        queue = session.open_queue(uri, write=True, on_ack=tally)
        for i in range(count):
            body = f"message {i:08d} ".encode()
            queue.post(body.ljust(size, b"."), properties={"seq": str(i)})
        if not session.flush(timeout=120):
            print(f"still waiting for {session.pending_count} ACKs after 120 s", file=sys.stderr)
    return tally


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS or :7701")
    parser.add_argument("--queue", default="hf://demo/orders")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tally = produce(args.address, args.queue, args.count, args.size)
    counts = {status.value: n for status, n in tally.by_status.items()}
    print(f"posted={args.count} acked={tally.total()} by_status={counts}")
    return 0 if tally.by_status[AckStatus.SUCCESS] == args.count else 1


if __name__ == "__main__":
    sys.exit(main())

"""The asyncio API: produce, then consume with ``async for``, through the local proxy.

    python examples/aio_producer_consumer.py --address 127.0.0.1:7701 --count 1000

Posts ``--count`` messages, waits until every one is ACKed, then reads them back
and confirms each. Prints what it saw; exits 1 unless every message was ACKed
SUCCESS once and read once.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from holdfast.sdk import Ack, QueueOptions
from holdfast.sdk.aio import Session


async def produce(address: str, uri: str, count: int) -> Counter[str]:
    statuses: Counter[str] = Counter()

    def on_ack(ack: Ack) -> None:  # runs on the event loop, once per PUT
        statuses[ack.status.value] += 1

    async with Session(address) as session:
        queue = await session.open_queue(uri, write=True, on_ack=on_ack)
        for i in range(count):
            await queue.post(b"order %d" % i, properties={"seq": str(i)})
        if not await session.flush(timeout=60):
            raise SystemExit("not every PUT was ACKed within 60 s")
    return statuses


async def consume(address: str, uri: str, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    async with Session(address) as session:
        queue = await session.open_queue(uri, read=True, options=QueueOptions(100))
        async for message in queue:
            payloads.append(message.payload)
            message.confirm()
            if len(payloads) == count:
                await queue.close()
    return payloads


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS or :7701")
    parser.add_argument("--queue", default="hf://demo/aio-orders")
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    statuses = await produce(args.address, args.queue, args.count)
    print(f"posted={args.count} acked={sum(statuses.values())} by_status={dict(statuses)}")
    payloads = await asyncio.wait_for(consume(args.address, args.queue, args.count), 60)
    print(f"consumed={len(payloads)} distinct={len(set(payloads))}")
    ok = statuses == Counter({"SUCCESS": args.count}) and len(set(payloads)) == args.count
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))

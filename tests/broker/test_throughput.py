"""100k messages through the memory broker in batches of 1000: every PUT ACKed once,
every message PUSHed once, in order. Prints the rates (``pytest -s``); asserts no timing."""

from __future__ import annotations

import time

from holdfast.proto import pb
from holdfast.proto.columns import put_batch
from tests.broker.util import connected, new_guid, options, unique_uri
from tests.support.processes import BrokerProcess

BATCHES, PER_BATCH, PAYLOAD = 100, 1000, b"x" * 100


def test_100k_puts_acked_and_pushed_once_in_order(shared_broker: BrokerProcess) -> None:
    uri = unique_uri("throughput")
    total = BATCHES * PER_BATCH
    guids = [new_guid() for _ in range(total)]
    frames = []
    for start in range(0, total, PER_BATCH):
        chunk = guids[start : start + PER_BATCH]
        batch = put_batch([1], chunk, [PAYLOAD] * len(chunk))
        frames.append(pb.ClientFrame(puts=batch).SerializeToString())
    with connected(shared_broker.address) as producer:
        producer.open(1, uri, write=True)
        started = time.perf_counter()
        for frame in frames:
            producer.send_raw(frame)
        acks = producer.acks(total, timeout=120)
        put_seconds = time.perf_counter() - started
    assert [a.guid for a in acks] == guids
    assert {a.status for a in acks} == {pb.STATUS_OK}
    with connected(shared_broker.address) as consumer:
        started = time.perf_counter()
        consumer.open(1, uri, read=True, options=options(messages=total, size=2**40))
        pushes = consumer.pushes(total, timeout=120)
        push_seconds = time.perf_counter() - started
    assert [p.guid for p in pushes] == guids
    print(
        f"\nmemory broker, 1 wire client, batches of {PER_BATCH} x {len(PAYLOAD)} B: "
        f"PUT->ACK {total / put_seconds:,.0f} msg/s, PUSH {total / push_seconds:,.0f} msg/s"
    )

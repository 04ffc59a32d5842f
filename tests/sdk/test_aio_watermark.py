"""Rule 7 in the asyncio API: a post over the high watermark is awaited for 5 s, then
refused with ``BandwidthLimitError`` and the message is not taken; the event loop keeps
running meanwhile (other coroutines are not held)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter

import pytest

from holdfast.sdk import Ack, BandwidthLimitError, SessionOptions, aio
from tests.support.processes import BrokerProcess
from tests.support.sessions import drain, unique_uri


@pytest.mark.timeout(120)
def test_asyncio_post_awaits_the_high_watermark_5_seconds_then_refuses(
    broker: BrokerProcess,
) -> None:
    options = SessionOptions(
        keepalive_time=60, keepalive_timeout=60, high_watermark_bytes=1024 * 1024
    )
    uri = unique_uri("aio-hwm")
    payload = b"x" * 100_000
    taken: list[uuid.UUID] = []
    acks: list[Ack] = []
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    async def main() -> tuple[float, float, int, int]:
        async with aio.Session(broker.address, options=options) as session:
            queue = await session.open_queue(uri, write=True, on_ack=acks.append)
            ticker = asyncio.create_task(tick())
            os.kill(broker.pid, signal.SIGSTOP)  # it stops reading: gRPC stops taking frames
            try:
                started = time.monotonic()
                with pytest.raises(BandwidthLimitError):
                    while time.monotonic() - started < 60:
                        taken.append(await queue.post(payload))
                refused_at = time.monotonic()
                pending = session.pending_count
                ticks_while_held = ticks
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            ticker.cancel()
            assert await session.flush(60)
        return started, refused_at, pending, ticks_while_held

    started, refused_at, pending, ticks_while_held = asyncio.run(main())
    assert refused_at - started >= 5.0  # the refused post was awaited the whole window
    assert ticks_while_held >= 20  # the loop ran other coroutines meanwhile
    assert pending == len(taken)
    assert Counter(a.guid for a in acks) == Counter({g: 1 for g in taken})
    assert drain(broker.address, uri, len(taken)) == Counter({g: 1 for g in taken})

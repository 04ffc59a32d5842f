"""The same publish-with-ack load through NATS JetStream, when a server is reachable.

``nats-py`` (the ``bench`` extra) publishes ``count`` messages with
``JetStreamContext.publish_async``, each with a unique ``Nats-Msg-Id`` header so
that JetStream deduplicates replays within its duplicate window (the counterpart
of Holdfast's GUID dedup), and waits for every PubAck. The stream is created for
the run under a unique name and deleted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

NATS_HOST = "127.0.0.1"
NATS_PORT = 4222


@dataclass
class NatsResult:
    """What one JetStream run measured."""

    storage: str
    count: int
    seconds: float
    rate: float
    failed: int


def reachable(host: str = NATS_HOST, port: int = NATS_PORT, timeout: float = 1.0) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


async def _publish(count: int, size: int, storage: str) -> NatsResult:
    import nats  # the bench extra; imported here so the rest runs without it
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(
        f"nats://{NATS_HOST}:{NATS_PORT}",
        connect_timeout=2,
        allow_reconnect=False,
        max_reconnect_attempts=0,
    )
    name = f"HOLDFAST_BENCH_{uuid.uuid4().hex[:12].upper()}"
    subject = f"holdfast.bench.{name.lower()}"
    try:
        js = nc.jetstream(publish_async_max_pending=20_000)
        await js.add_stream(
            StreamConfig(
                name=name,
                subjects=[subject],
                storage=StorageType.MEMORY if storage == "memory" else StorageType.FILE,
                duplicate_window=120.0,
            )
        )
        try:
            payload = os.urandom(size)
            futures: list[Any] = []
            started = time.perf_counter()
            for i in range(count):
                futures.append(
                    await js.publish_async(subject, payload, headers={"Nats-Msg-Id": f"m{i}"})
                )
            results = await asyncio.gather(*futures, return_exceptions=True)
            seconds = time.perf_counter() - started
        finally:
            await js.delete_stream(name)
    finally:
        await nc.close()
    failed = sum(1 for result in results if isinstance(result, BaseException))
    return NatsResult(storage, count, seconds, (count - failed) / seconds, failed)


def publish(count: int, size: int, storage: str) -> NatsResult:
    """Publish ``count`` messages of ``size`` bytes to a fresh JetStream stream with
    ``storage`` ("memory" or "file"); every publish waits for its PubAck."""
    return asyncio.run(_publish(count, size, storage))

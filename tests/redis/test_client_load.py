"""``RedisClient`` under more concurrent calls than redis-py's pool holds.

redis-py's asyncio pool opens a connection per concurrent command up to 100 and then
raises ``MaxConnectionsError``, a ``ConnectionError`` that looks like an outage: a
node under load logged "unreachable (Too many connections)" and backed off each
extra call. ``RedisClient.call`` keeps at most ``MAX_IN_FLIGHT`` calls at Redis; the
rest wait their turn."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from holdfast.broker.redis.client import MAX_IN_FLIGHT, RedisClient, parse_redis_spec
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

CALLS = 250
HOLD = 0.2
"""Seconds each call keeps its connection (a ``BLPOP`` on an empty list)."""


def test_more_concurrent_calls_than_the_pool_holds_wait_their_turn_and_none_is_an_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert CALLS > 2 * MAX_IN_FLIGHT and CALLS > 100  # beyond redis-py's pool

    async def main(url: str) -> tuple[list[object], int]:
        client = RedisClient(parse_redis_spec(url), retry_window=20.0)
        try:
            redis = client.redis

            async def one(n: int) -> object:
                return await client.call("BLPOP", lambda: redis.blpop([f"empty-{n}"], HOLD))

            results = await asyncio.gather(*(one(n) for n in range(CALLS)))
            clients = await client.call("CLIENT LIST", lambda: redis.client_list())
            return list(results), len(clients)
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING), RedisServer(tmp_path / "redis", aof=False) as server:
        results, connections = asyncio.run(main(server.url))
    assert results == [None] * CALLS  # every BLPOP ran and timed out empty
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert not unreachable, unreachable[0].getMessage()
    assert connections <= MAX_IN_FLIGHT + 1  # this client's pool, plus Redis's own count

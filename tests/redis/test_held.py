"""The store's held connections (``holdfast.broker.redis.held``): every reply reaches
the call that sent its command, whatever happened to the call before it (an error
reply, a timeout, a cancel), and a Sentinel-managed one reaches the primary the
Sentinels name."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.held import HeldConnections
from tests.redis.test_sentinel import SERVICE, watched_pair

pytestmark = pytest.mark.timeout(60)

SPIN = """
local started = redis.call('TIME')
local until_us = started[1] * 1000000 + started[2] + tonumber(ARGV[1]) * 1000
repeat
    local now = redis.call('TIME')
until now[1] * 1000000 + now[2] >= until_us
return 'spun'
"""
"""A script that holds Redis for ARGV[1] ms, then answers 'spun'."""


@contextlib.asynccontextmanager
async def held_of(url: str, timeout: float = 5.0) -> AsyncIterator[HeldConnections]:
    """Connections held from the pool of a store client of ``url``; closed after."""
    client = RedisClient(parse_redis_spec(url))
    held = HeldConnections(client.redis.connection_pool, timeout)
    try:
        yield held
    finally:
        await held.close()
        await client.close()


async def client_id(held: HeldConnections) -> int:
    return int(await held.execute("CLIENT", "ID"))


def test_an_error_reply_leaves_the_connection_in_step(redis_url: str) -> None:
    async def body() -> None:
        async with held_of(redis_url) as held:
            first = await client_id(held)
            with pytest.raises(ResponseError):
                await held.execute("EVALSHA", "0" * 40, 0)  # NOSCRIPT
            assert await held.execute("ECHO", "after") == b"after"
            assert await client_id(held) == first  # the same connection, kept
            assert held.held == 1

    asyncio.run(body())


def test_a_reply_that_comes_too_late_is_never_read_by_the_next_call(redis_url: str) -> None:
    async def body() -> None:
        async with held_of(redis_url, timeout=0.1) as held:
            first = await client_id(held)
            with pytest.raises(RedisTimeoutError):
                await held.execute("EVAL", SPIN, 0, 400)
            # The next call waits out the script, and gets its own reply, not 'spun'.
            held.timeout = 5.0
            assert await held.execute("ECHO", "after") == b"after"
            assert await client_id(held) != first  # the late one was dropped
            assert held.held == 1

    asyncio.run(body())


def test_a_cancelled_call_leaves_no_reply_behind(redis_url: str) -> None:
    async def body() -> None:
        async with held_of(redis_url) as held:
            # wait_for cancels the call 50 ms into the script's 300.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(held.execute("EVAL", SPIN, 0, 300), 0.05)
            assert await held.execute("ECHO", "after") == b"after"

    asyncio.run(body())


def test_calls_at_once_each_get_their_own_reply(redis_url: str) -> None:
    async def body() -> None:
        async with held_of(redis_url) as held:
            replies = await asyncio.gather(*(held.execute("ECHO", str(i)) for i in range(50)))
            assert replies == [str(i).encode() for i in range(50)]
            assert 1 <= held.held <= 50

    asyncio.run(body())


def test_a_sentinel_managed_connection_reaches_the_primary(tmp_path: Path) -> None:
    with watched_pair(tmp_path, aof=False) as (primary, _replica, sentinel_port):

        async def body() -> None:
            async with held_of(f"redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}") as held:
                reply = await held.execute("CONFIG", "GET", "port")  # a map
                assert reply == {b"port": str(primary.port).encode()}

        asyncio.run(body())

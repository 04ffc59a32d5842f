"""The broker's Redis connections pack commands with hiredis (``packing``): the same
bytes as redis-py's own packer, for every kind of argument the scripts send, on the
plain, TLS and Sentinel pools."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.packing import HiredisPacking, pack

COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "hf:{q}:ready", "hf:{q}:body", b"\x00\xff" * 8, "1234", 0, "{}"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", b"node-1"),
    ("SET", "k", "välue", "PX", 300_000),
    ("HSET", "h", b"g" * 16, b"x" * 70_000, -5, 2.5),
    ("RPUSH", "l", bytearray(b"abc"), memoryview(b"def")),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[str(c[0]) for c in COMMANDS])
def test_hiredis_packs_the_same_bytes_as_redis_py(command: tuple[Any, ...]) -> None:
    ours = b"".join(pack(*command))
    theirs = b"".join(bytes(part) for part in Connection().pack_command(*command))
    assert ours == theirs


def test_a_pipeline_packs_its_commands_one_after_the_other() -> None:
    packer = HiredisPacking()
    theirs = b"".join(bytes(p) for p in Connection().pack_commands(COMMANDS[:4]))
    assert b"".join(packer.pack_commands(COMMANDS[:4])) == theirs


def test_an_argument_redis_cannot_take_is_a_data_error() -> None:
    with pytest.raises(DataError):
        pack("SET", "k", object())


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/s/0"]
)
def test_the_brokers_pools_open_connections_that_pack_with_hiredis(url: str) -> None:
    async def connection_class() -> type:
        client = RedisClient(parse_redis_spec(url))
        return client.redis.connection_pool.connection_class  # type: ignore[no-any-return]

    assert issubclass(asyncio.run(connection_class()), HiredisPacking)

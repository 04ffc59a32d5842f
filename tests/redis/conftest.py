"""Fixtures of the Redis tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A client of one redis-server for the scripts run directly (each test has queues
    of its own: ``scripts_kit.queue``)."""
    with RedisServer(tmp_path_factory.mktemp("scripts"), aof=False) as server:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        yield client
        client.close()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of one redis-server for a module's brokers and stores (each test has
    queues of its own)."""
    with RedisServer(tmp_path_factory.mktemp("redis"), aof=False) as server:
        yield server.url

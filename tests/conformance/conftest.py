"""Fixtures of the conformance suite: every test runs on every store (memory, sqlite,
Redis, a 3-primary Redis Cluster), and, where a client can observe the rule, both
directly and through the proxy. The Redis servers are started here, once per run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.harness import World, open_world
from tests.support.redis_server import RedisServer
from tests.support.redis_server import redis_cluster as start_cluster

STORES = ("memory", "sqlite", "redis", "redis-cluster")
PATHS = ("direct", "proxy")

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the Redis worlds (each test uses queues of its own)."""
    with RedisServer(tmp_path_factory.mktemp("redis"), aof=False) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    """Three Redis Cluster primaries, slots spread over them."""
    with start_cluster(tmp_path_factory.mktemp("cluster"), aof=False) as servers:
        yield servers


def store_spec(kind: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """The ``--store`` value of a store kind (starting Redis when first asked)."""
    if kind == "memory":
        return "memory"
    if kind == "sqlite":
        return f"sqlite:{directory / 'broker.db'}"
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url
    cluster: list[RedisServer] = request.getfixturevalue("redis_cluster")
    return "redis+cluster://" + ",".join(s.address for s in cluster)


@pytest.fixture(
    scope="module",
    params=[(s, p) for s in STORES for p in PATHS],
    ids=[f"{s}-{p}" for s in STORES for p in PATHS],
)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker on one store, seen directly or through a proxy."""
    kind, path = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-{path}")
    with open_world(kind, store_spec(kind, request, directory), path, directory) as world:
        yield world


@pytest.fixture(scope="module", params=STORES)
def direct_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker on one store, seen directly: for rules about the broker's own state
    (restarts, admin calls), which a proxy cannot change."""
    kind = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-direct")
    with open_world(kind, store_spec(kind, request, directory), "direct", directory) as world:
        yield world


@pytest.fixture(scope="module", params=[s for s in STORES if s != "memory"])
def durable_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker on each store that keeps messages across its restart (memory keeps
    nothing, by design), seen directly: the restart is the broker's."""
    kind = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-durable")
    with open_world(kind, store_spec(kind, request, directory), "direct", directory) as world:
        yield world


@pytest.fixture(
    scope="module",
    params=[(s, p) for s in STORES if s != "memory" for p in PATHS],
    ids=[f"{s}-{p}" for s in STORES if s != "memory" for p in PATHS],
)
def restarted_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker on each durable store, seen directly or through a proxy, for rules that
    must hold across the broker's restart: through the proxy, what the clients did
    before it (a CONFIRM, a PUT) was relayed, and the proxy's upstream link reconnects
    after it."""
    kind, path = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-{path}-restarted")
    with open_world(kind, store_spec(kind, request, directory), path, directory) as world:
        yield world

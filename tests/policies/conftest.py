"""Fixtures for queue policies and dead letters: a real broker process per test, on
the memory, the sqlite or the Redis store (a ``redis-server`` of the test's own), and
an admin client for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from holdfast.sdk.admin import AdminClient
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["memory", "sqlite", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on each store (sqlite in a file of this test's; Redis started here)."""
    with ExitStack() as stack:
        if request.param == "memory":
            store = "memory"
        elif request.param == "sqlite":
            store = f"sqlite:{tmp_path / 'broker.db'}"
        else:
            store = stack.enter_context(RedisServer(tmp_path / "redis", aof=False)).url
        yield stack.enter_context(BrokerProcess(["--store", store]))


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    """An admin client of ``broker``."""
    with AdminClient(broker.address) as client:
        yield client

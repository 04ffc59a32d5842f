"""Fixtures for queue policies and dead letters: a real broker process per test, on
the memory or the sqlite store, and an admin client for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.sdk.admin import AdminClient
from tests.support.processes import BrokerProcess


@pytest.fixture(params=["memory", "sqlite"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on each store (the sqlite one in a file of this test's)."""
    store = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'broker.db'}"
    with BrokerProcess(["--store", store]) as process:
        yield process


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    """An admin client of ``broker``."""
    with AdminClient(broker.address) as client:
        yield client

"""Fixtures for the broker tests: one broker per module where the tests can share it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import BrokerProcess


@pytest.fixture(scope="module")
def shared_broker() -> Iterator[BrokerProcess]:
    """A memory-store broker shared by the tests of one module (each test uses queues
    of its own)."""
    with BrokerProcess() as process:
        yield process

"""Fixtures for the broker tests: one broker per module where the tests can share it, and
a sqlite store file with a store open on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.broker.sqlite_store import SqliteStore
from tests.support.processes import BrokerProcess


@pytest.fixture(scope="module")
def shared_broker() -> Iterator[BrokerProcess]:
    """A memory-store broker shared by the tests of one module (each test uses queues
    of its own)."""
    with BrokerProcess() as process:
        yield process


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """Where a test's sqlite store lives (no file yet)."""
    return tmp_path / "broker.db"


@pytest.fixture
def store(path: Path) -> Iterator[SqliteStore]:
    """A sqlite store open on ``path``, closed after the test."""
    opened = SqliteStore(path)
    try:
        yield opened
    finally:
        opened.close()

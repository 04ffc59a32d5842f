"""Fixtures shared by every test suite: broker and proxy subprocesses."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.support.processes import BrokerProcess, ProxyProcess


@pytest.fixture
def broker() -> Iterator[BrokerProcess]:
    """A started broker (memory store, default options) on a free port, stopped at
    teardown whatever the test did to it."""
    process = BrokerProcess()
    try:
        process.start()
        yield process
    finally:
        process.close()


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers with extra arguments: ``broker_factory("--dedup-window", "1.5")``.
    Every broker it started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def start(*args: str) -> BrokerProcess:
        process = BrokerProcess(list(args))
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.close()


@pytest.fixture
def proxy(broker: BrokerProcess) -> Iterator[ProxyProcess]:
    """A ``holdfast-proxy`` in front of the ``broker`` fixture, stopped by PID at teardown."""
    with ProxyProcess(
        ["--upstream", broker.address, "--keepalive", "0.5", "--keepalive-timeout", "1"]
    ) as started:
        yield started


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

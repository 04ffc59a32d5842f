"""Fixtures shared by every test suite: broker and proxy subprocesses, Toxiproxy."""

from __future__ import annotations

import os

# Before anything imports grpc: its fork handlers, in a process whose gRPC threads are
# busy, can crash a child between fork and exec (seen: PySpark's JVM launcher, which
# forks with a preexec_fn, exiting before it sent its port, in an xdist worker that
# had run gRPC tests before its Spark module). The tests never fork a process that
# then uses gRPC without exec, so the handlers buy nothing here.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from toxiproxy.exceptions import NotFound

from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.toxics import ToxiproxyServer, new_link

CHAOS_ENV = "HOLDFAST_CHAOS"
"""Set to 1 to run the tests marked ``chaos`` (``make chaos``); they are skipped otherwise."""


LONGEST_FIRST = (
    "tests/spark/test_connector_stream.py",
    "tests/spark/test_spark_sink.py",
    "tests/faults/test_reconnection.py",
    "tests/packaging/test_distribution.py",
    "tests/spark/test_connector_transactional.py",
    "tests/spark/test_connector_speculation.py",
    "tests/conformance/test_lifecycle_machine.py",
    "tests/spark/test_connector_write.py",
    "tests/faults/test_edges.py",
    "tests/redis/test_fencing.py",
    "tests/rpc/test_faults.py",
    "tests/conformance/test_depth_and_redirect.py",
    "tests/policies/test_queue_lifecycle.py",
    "tests/redis/test_nodes.py",
    "tests/spark/test_connector_redis.py",
    "tests/spark/test_connector_read.py",
)
"""The test files that take longest (``--junitxml`` times, three workers on two
cores), longest first.

``make test`` runs files whole on three workers (``--dist loadfile``), handing the next
file in collection order to whichever worker is free (``--no-loadscope-reorder``):
with these first, the long files start early and the many short ones fill the gaps,
so the workers finish together instead of one running the Spark files alone at the
end. A file missing here only runs in its usual place."""


def _longest_first(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # sort is stable: the other files, and the tests inside each file, keep their order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the longest test files first (``LONGEST_FIRST``), and skip the long
    randomized fault schedules unless ``$HOLDFAST_CHAOS`` is 1."""
    _longest_first(items)
    if os.environ.get(CHAOS_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"long chaos schedule: run with {CHAOS_ENV}=1 (make chaos)")
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture(scope="session")
def toxiproxy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    """A Toxiproxy server for the whole run: the real ``toxiproxy-server`` when it is on
    PATH or named by ``$TOXIPROXY_SERVER``, else ``tests.toxiproxy_server``. Stopped by
    PID at the end; its log is in the session's temporary directory."""
    log = tmp_path_factory.mktemp("toxiproxy") / "server.log"
    with ToxiproxyServer(log=log) as server:
        yield server


@pytest.fixture(scope="session")
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Any:
    """A ``toxiproxy.Toxiproxy`` client of the session's server."""
    return toxiproxy_server.client()


@pytest.fixture
def toxic_link(toxiproxy: Any) -> Iterator[Callable[[str, str], Any]]:
    """Create Toxiproxy proxies: ``toxic_link("broker", broker.address)`` returns a
    ``toxiproxy.Proxy`` listening on a free port; each is deleted at teardown, which
    closes its connections."""
    created: list[Any] = []

    def create(name: str, upstream: str) -> Any:
        link = new_link(toxiproxy, name, upstream)
        created.append(link)
        return link

    yield create
    for link in created:
        with contextlib.suppress(NotFound):  # the test deleted it itself
            link.destroy()

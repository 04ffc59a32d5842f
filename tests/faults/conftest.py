"""Fixtures of the fault tests: every scenario takes ``net`` and runs once on each
topology of ``tests.faults.network``."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.faults.network import (
    FAILED,
    PATHS,
    TOPOLOGIES,
    LinkFactory,
    Network,
    network,
    reported,
)
from tests.support.processes import BrokerProcess


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember failures, so that fixtures can print what the servers logged."""
    result = yield
    if result.failed:
        item.stash[FAILED] = True
    return result


@pytest.fixture(params=TOPOLOGIES)
def net(
    request: pytest.FixtureRequest, broker: BrokerProcess, toxic_link: LinkFactory
) -> Iterator[Network]:
    """A memory-store broker, and in the ``proxy`` topology a proxy, with Toxiproxy
    links between the hops."""
    with network(request.param, broker, toxic_link) as built, reported(request, built):
        yield built


@pytest.fixture(params=PATHS)
def hop_net(
    request: pytest.FixtureRequest, broker: BrokerProcess, toxic_link: LinkFactory
) -> Iterator[Network]:
    """Like ``net``, and through the proxy also with faults on one hop only: the
    client hop (the proxy keeps the broker) or the upstream hop (the session keeps
    the proxy)."""
    with network(request.param, broker, toxic_link) as built, reported(request, built):
        yield built

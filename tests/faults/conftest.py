"""Fixtures of the fault tests: every scenario takes ``net`` and runs once on each
topology of ``tests.faults.network``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.network import PATHS, TOPOLOGIES, LinkFactory, Network, network
from tests.support.processes import BrokerProcess


@pytest.fixture(params=TOPOLOGIES)
def net(
    request: pytest.FixtureRequest, broker: BrokerProcess, toxic_link: LinkFactory
) -> Iterator[Network]:
    """A memory-store broker, and in the ``proxy`` topology a proxy, with Toxiproxy
    links between the hops."""
    with network(request.param, broker, toxic_link) as built:
        yield built


@pytest.fixture(params=PATHS)
def hop_net(
    request: pytest.FixtureRequest, broker: BrokerProcess, toxic_link: LinkFactory
) -> Iterator[Network]:
    """Like ``net``, and through the proxy also with faults on one hop only: the
    client hop (the proxy keeps the broker) or the upstream hop (the session keeps
    the proxy)."""
    with network(request.param, broker, toxic_link) as built:
        yield built

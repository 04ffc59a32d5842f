"""Process faults with Toxiproxy between the hops: SIGKILL and restart of the proxy,
and of a broker on the sqlite store. The same three checks as every fault test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.network import TOPOLOGIES, LinkFactory, Network, network, reported
from tests.faults.streams import check, streaming
from tests.support.processes import BrokerProcess
from tests.support.toxics import down
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=TOPOLOGIES)
def sqlite_net(
    request: pytest.FixtureRequest, tmp_path: Path, toxic_link: LinkFactory
) -> Iterator[Network]:
    """Like ``net``, on a broker with the sqlite store (stopped by PID at the end)."""
    broker = BrokerProcess(["--store", f"sqlite:{tmp_path / 'broker.db'}"])
    try:
        broker.start()
        with network(request.param, broker, toxic_link) as built, reported(request, built):
            yield built
    finally:
        broker.close()


def test_broker_killed_and_restarted_on_the_sqlite_store(sqlite_net: Network) -> None:
    """What the broker ACKed survives kill -9 and its dedup history too, so the replays
    of what it had received but not ACKed are not enqueued twice: the queue holds every
    message exactly once, whatever the topology."""
    net = sqlite_net
    with streaming(net, "broker-kill") as s:
        s.wait_acked(500)
        lost, restored = s.losses(), s.restores()
        net.broker.kill()
        net.wait_broker_side_lost(s.events, lost)
        s.wait_more_posted(300)  # buffered while the broker is down
        net.broker.restart()
        net.wait_broker_side_restored(s.events, restored)
        s.wait_acked(len(s.acks) + 300)
    check(s)


def test_proxy_killed_and_restarted_during_an_upstream_outage(
    broker: BrokerProcess, toxic_link: LinkFactory
) -> None:
    """The proxy dies holding PUTs it took from the session but could not send: the
    session still has them (unacknowledged) and replays them to the new proxy."""
    with network("proxy", broker, toxic_link) as net, streaming(net, "proxy-kill") as s:
        assert net.proxy is not None
        s.wait_acked(300)
        lost = s.losses()
        with down(net.upstream):
            wait_until(lambda: s.losses()[1] > lost[1], 15, "the proxy to lose the broker")
            s.wait_more_posted(300)  # taken by the proxy, stuck in it
            net.proxy.kill()
            wait_until(lambda: s.losses()[0] > lost[0], 15, "the session to lose the proxy")
            s.wait_more_posted(200)  # buffered in the session
            net.proxy.restart()
        restored = len(s.acks)
        s.wait_acked(restored + 300)
    check(s)

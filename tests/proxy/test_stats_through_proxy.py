"""``Session.stats()`` across a real proxy restart: reconnects and retransmitted PUTs
counted where they happen, with a broker and a proxy as processes on 127.0.0.1."""

from __future__ import annotations

import pytest

from holdfast.sdk import AckStatus, Session
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, drain, unique_uri
from tests.support.waiting import wait_until


@pytest.mark.timeout(120)
def test_a_proxy_restart_counts_one_reconnect_and_the_replayed_puts(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("stats-proxy")
    with (
        ProxyProcess(["--upstream", broker.address]) as proxy,
        Session(proxy.address, options=FAST) as session,
    ):
        queue = session.open_queue(uri, write=True)
        for i in range(50):
            queue.post(b"before-%d" % i)
        assert session.flush(timeout=30)
        before = session.stats()
        proxy.kill()
        wait_until(lambda: not session.connected, 10, "the session to see the proxy die")
        for i in range(100):
            queue.post(b"during-%d" % i)
        during = session.stats()
        proxy.restart()
        assert session.flush(timeout=60)
        after = session.stats()
    assert (before.reconnects, before.retransmitted_puts) == (0, 0)
    assert during.buffered_puts == 100
    assert after.reconnects == 1
    assert after.retransmitted_puts == 100  # posted while down, sent by the restore
    assert dict(after.acks) == {AckStatus.SUCCESS: 150}
    assert after.buffered_puts == 0
    assert sum(drain(broker.address, uri, 150).values()) == 150
